"""Saga definitions by type and version: what a process has loaded."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.errors import UnknownDefinitionVersion, UnknownSagaType


class Registry:
    """Saga definitions by type and version; new sagas use the latest version."""

    def __init__(self, definitions: Sequence[SagaDefinition]) -> None:
        self._by_version: dict[tuple[str, int], SagaDefinition] = {}
        self._latest: dict[str, SagaDefinition] = {}
        for d in definitions:
            key = (d.saga_type, d.version)
            if key in self._by_version:
                raise ValueError(f"saga {d.saga_type!r} version {d.version} is registered twice")
            self._by_version[key] = d
            if d.saga_type not in self._latest or self._latest[d.saga_type].version < d.version:
                self._latest[d.saga_type] = d

    def latest(self, saga_type: str) -> SagaDefinition:
        try:
            return self._latest[saga_type]
        except KeyError:
            known = ", ".join(sorted(self._latest)) or "none"
            raise UnknownSagaType(f"unknown saga type {saga_type!r}; known: {known}") from None

    def get(self, saga_type: str, version: int) -> SagaDefinition:
        try:
            return self._by_version[(saga_type, version)]
        except KeyError:
            loaded = ", ".join(map(str, self.versions(saga_type))) or "none"
            raise UnknownDefinitionVersion(
                f"saga type {saga_type!r} version {version} is not loaded in this process "
                f"(loaded: {loaded})"
            ) from None

    def loaded(self, saga_type: str, version: int) -> bool:
        return (saga_type, version) in self._by_version

    def versions(self, saga_type: str) -> tuple[int, ...]:
        """The versions of ``saga_type`` this process has loaded, lowest first."""
        return tuple(sorted(v for t, v in self._by_version if t == saga_type))

    def __iter__(self) -> Iterator[SagaDefinition]:
        return iter(self._by_version.values())
