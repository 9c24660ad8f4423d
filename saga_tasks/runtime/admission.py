"""Admission control: refuse a start the deployment cannot take on now, instead of
letting a backlog grow until every saga is late.

Off unless configured. ``SAGA_MAX_ACTIVE`` bounds the active sagas of a type (a number
for every type, or ``type=N`` entries); ``SAGA_MAX_WAITING`` bounds the commands waiting
for capacity (flow control) in any queue the saga's steps send to, those of sagas in review
aside (they wait for a person, not for capacity). A refused start raises
``SagaOverloaded`` (HTTP 429 with ``Retry-After``, CLI exit 4) and writes nothing; a
start whose business key already names a saga is a repeat, answered as always.

The counts are read at most once per ``refresh`` seconds per process: a limit is a
bound on load, not a ledger, and may be passed by what the processes start within one
refresh.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping

from sqlalchemy import Engine

from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.errors import SagaOverloaded
from saga_tasks.observability import metrics
from saga_tasks.persistence import dispatch, sagas
from saga_tasks.persistence.db import translated

log = logging.getLogger("saga_tasks.admission")


class Admission:
    """Decides whether a start may go ahead, from counts read at most once a ``refresh``."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        *,
        max_active: Mapping[str, float],
        max_waiting: int,
        refresh: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self.max_active = dict(max_active)
        self.max_waiting = max_waiting
        self.refresh = refresh
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._active: dict[str, int] = {}
        self._waiting: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.max_waiting or any(self.max_active.values()))

    def admit(self, definition: SagaDefinition, business_key: str) -> None:
        """Return if the start may go ahead; raise ``SagaOverloaded`` if not."""
        if not self.enabled:
            return
        saga_type = definition.saga_type
        limit = int(self.max_active.get(saga_type, self.max_active.get("*", 0)))
        active, waiting = self._counts()
        refusal: tuple[str, str] | None = None
        if limit and active.get(saga_type, 0) >= limit:
            refusal = (
                "active",
                f"{active[saga_type]} {saga_type} sagas are active, the most SAGA_MAX_ACTIVE "
                f"allows ({limit})",
            )
        elif self.max_waiting:
            full = [q for q in sorted(definition.queues) if waiting.get(q, 0) >= self.max_waiting]
            if full:
                refusal = (
                    "waiting",
                    f"{waiting[full[0]]} commands wait for capacity at {full[0]}, the most "
                    f"SAGA_MAX_WAITING allows ({self.max_waiting})",
                )
        if refusal is None or self._is_repeat(saga_type, business_key):
            return
        reason, message = refusal
        metrics.ADMISSION_REFUSED.labels(saga_type=saga_type, reason=reason).inc()
        log.warning("start refused: %s", message, extra={"saga_type": saga_type})
        raise SagaOverloaded(
            f"start of a {saga_type} saga refused: {message}",
            retry_after=max(1, math.ceil(self.refresh)),
            reason=reason,
        )

    def _counts(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            if self._monotonic() - self._read_at >= self.refresh:
                engine = self._engine()
                with translated(engine.url), engine.connect() as conn:
                    self._active = sagas.active_counts(conn)
                    self._waiting = {q: f.waiting for q, f in dispatch.counts(conn).items()}
                self._read_at = self._monotonic()
            return self._active, self._waiting

    def _is_repeat(self, saga_type: str, business_key: str) -> bool:
        engine = self._engine()
        with translated(engine.url), engine.connect() as conn:
            return sagas.find_by_key(conn, saga_type, business_key) is not None
