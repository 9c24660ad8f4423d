"""Definition versions still in use, against those a process loads.

Versions of a saga type run side by side: new sagas take the newest, unfinished ones keep
the version they started with. A process that decides sagas without one of those versions
would hand its sagas to a person at their next deadline, and fail their replies; so it
refuses to start, naming what is missing and how to fix it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from saga_tasks.core.registry import Registry
from saga_tasks.persistence import versions
from saga_tasks.persistence.db import translated


@dataclass(frozen=True)
class VersionInUse:
    """A definition version unfinished sagas use, and how many of them."""

    saga_type: str
    version: int
    sagas: int


def unloaded(engine: Engine, registry: Registry) -> list[VersionInUse]:
    """The versions unfinished sagas use that ``registry`` lacks (one GROUP BY query)."""
    with translated(engine.url), engine.connect() as conn:
        used = versions.unfinished_versions(conn)
    return [VersionInUse(t, v, n) for t, v, n in used if not registry.loaded(t, v)]


def refusal(missing: Sequence[VersionInUse], registry: Registry) -> str:
    """Why a process that decides sagas will not start, and what to do about it."""
    each = "; ".join(
        f"saga type {m.saga_type!r} version {m.version} is used by {m.sagas} unfinished "
        f"saga{'' if m.sagas == 1 else 's'} (loaded here: "
        f"{', '.join(map(str, registry.versions(m.saga_type))) or 'none'})"
        for m in missing
    )
    that = "that definition" if len(missing) == 1 else "those definitions"
    return (
        f"refusing to start: {each}. Keep {that} registered in the SagaApp (sagas=[...], "
        "next to the newer one) until no unfinished saga uses it, or first finish those "
        "sagas (RUNNING, COMPENSATING or MANUAL_REVIEW) or move them to a loaded version: "
        "saga-tasks migrate SAGA_ID --to-version V"
    )
