"""Firing scheduled sagas: a worker starts the saga of the tick a firing carries.

Beat sends one firing per tick (``saga_tasks.worker.beat``); this runs it. The tick comes
from the message, never from the clock, so a firing delivered late starts its own tick's
saga, or none once its grace has passed (logged, counted, recorded). The saga and its run
row are written in one transaction, by business key: a tick fired twice starts one saga
and counts a second firing. Nothing a firing meets is raised to Celery: a payload
function that raises, a payload the saga refuses, admission control, a database away:
each is logged (never the payload), counted and, where the database answers, recorded as
the tick's error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from saga_tasks.core.clock import Clock
from saga_tasks.core.schedules import Schedule, format_tick, parse_tick
from saga_tasks.errors import (
    BusinessKeyConflict,
    SagaOverloaded,
    SagaTasksError,
    ServiceUnavailable,
)
from saga_tasks.observability import metrics
from saga_tasks.persistence import schedule_runs
from saga_tasks.persistence.db import translated
from saga_tasks.runtime.orchestrator import SagaHandle

log = logging.getLogger("saga_tasks.runtime.schedules")

RUNS_KEEP = timedelta(days=7)
"""Runs are kept this long (each schedule's newest always): housekeeping prunes the rest."""

Start = Callable[..., SagaHandle]
"""``Orchestrator.start``: (saga_type, business_key, payload, *, session) -> handle."""


@dataclass(frozen=True)
class Fired:
    """What one firing did."""

    outcome: str
    """started, existing, late, failed, unavailable or dropped."""
    saga_id: str | None = None


@dataclass(frozen=True)
class _Firing:
    """One firing being run: its schedule, tick, when it runs, and its log fields."""

    schedule: Schedule
    tick: datetime
    now: datetime
    missed: int
    fields: dict[str, Any]

    @property
    def key(self) -> str:
        return self.schedule.business_key(self.tick)


def _count(name: str, fired: Fired) -> Fired:
    metrics.SCHEDULE_FIRINGS.labels(schedule=name, outcome=fired.outcome).inc()
    return fired


class Timetable:
    """The app's schedules, and the worker side of firing them."""

    def __init__(
        self,
        schedules: Sequence[Schedule],
        *,
        engine: Callable[[], Engine],
        start: Start,
        clock: Clock,
        runs_keep: timedelta = RUNS_KEEP,
    ) -> None:
        self.schedules = tuple(schedules)
        self.by_name = {s.name: s for s in self.schedules}
        self._engine = engine
        self._start = start
        self.clock = clock
        self.runs_keep = runs_keep

    def fire(self, name: str, tick_text: str, *, missed: int = 0) -> Fired:
        """Start the saga of ``tick_text`` for schedule ``name``, once."""
        schedule = self.by_name.get(name)
        fields: dict[str, Any] = {"schedule": name, "tick": str(tick_text)[:40]}
        if schedule is None:
            log.warning("firing of a schedule this app does not have: dropped", extra=fields)
            return _count(name, Fired("dropped"))
        try:
            tick = parse_tick(tick_text)
        except ValueError:
            log.warning("firing with a tick that is not a time: dropped", extra=fields)
            return _count(name, Fired("dropped"))
        if not schedule.on_grid(tick):
            log.warning(
                "firing of a time that is not one of the schedule's ticks (changed since it "
                "was sent?): dropped",
                extra=fields,
            )
            return _count(name, Fired("dropped"))
        fields["saga_type"] = schedule.saga_type
        if missed > 0:
            metrics.SCHEDULE_MISSED.labels(schedule=name).inc(missed)
            log.warning(
                "%d earlier ticks were missed (no beat fired them in time)", missed, extra=fields
            )
        firing = _Firing(schedule, tick, self.clock.now(), missed, fields)
        if schedule.late(tick, firing.now):
            lateness = (firing.now - tick).total_seconds()
            log.warning(
                "firing %.1f s after its tick, past its grace: the tick starts no saga",
                lateness,
                extra=fields,
            )
            error = (
                f"late: fired {lateness:.1f} s after its tick, after "
                f"{format_tick(schedule.deadline(tick))}"
            )
            return self._record(firing, Fired("late"), error=error)
        try:
            payload = schedule.payload_for(tick)
        except Exception as exc:  # noqa: BLE001 - the app's function may raise anything
            # Its message may quote data: the type only, in the log and the record.
            log.error(
                "the payload function raised %s: the tick starts no saga",
                type(exc).__name__,
                extra=fields,
            )
            error = f"the payload function raised {type(exc).__name__}"
            return self._record(firing, Fired("failed"), error=error)
        try:
            json.dumps(payload)
        except (TypeError, ValueError):
            log.error("the payload function returned what is not JSON", extra=fields)
            error = "the payload function returned what is not JSON"
            return self._record(firing, Fired("failed"), error=error)
        return self._start_saga(firing, payload)

    def _start_saga(self, firing: _Firing, payload: dict[str, Any]) -> Fired:
        schedule, fields = firing.schedule, firing.fields
        engine = self._engine()
        with translated(engine.url), engine.connect() as conn:
            before = schedule_runs.started(conn, schedule.name, firing.tick)
        if before is not None:
            log.info("the tick started its saga before; nothing more started", extra=fields)
            return self._record(firing, Fired("existing", before))
        try:
            with translated(engine.url), Session(engine) as session, session.begin():
                handle = self._start(schedule.saga_type, firing.key, payload, session=session)
                self._write(session.connection(), firing, saga_id=handle.saga_id)
        except BusinessKeyConflict as exc:
            # The tick's saga exists, started with another payload: a payload function
            # that does not return the same payload for the same tick.
            log.warning(
                "the tick's saga was started before with another payload (is the payload "
                "function deterministic per tick?); nothing more started",
                extra={**fields, "saga_id": exc.saga_id},
            )
            return self._record(firing, Fired("existing", exc.saga_id))
        except ServiceUnavailable as exc:
            log.error("cannot start the tick's saga: %s", exc, extra=fields)
            return self._record(firing, Fired("unavailable"), error=str(exc))
        except SagaOverloaded as exc:
            log.warning("admission control refused the tick's saga: %s", exc, extra=fields)
            return self._record(firing, Fired("failed"), error=f"refused: {exc}")
        except SagaTasksError as exc:  # an invalid payload, a bad key: the app's to fix
            log.error("the tick's saga was refused (%s): %s", type(exc).__name__, exc, extra=fields)
            return self._record(firing, Fired("failed"), error=f"{type(exc).__name__}: {exc}")
        log.info(
            "scheduled saga %s",
            "started" if handle.created else "already started for this tick",
            extra={**fields, "saga_id": handle.saga_id},
        )
        return _count(
            schedule.name, Fired("started" if handle.created else "existing", handle.saga_id)
        )

    def _record(self, firing: _Firing, fired: Fired, *, error: str | None = None) -> Fired:
        """Record what a firing did in a transaction of its own: the saga it found, or
        ``error`` (which never overwrites a tick that started its saga)."""
        try:
            with translated(self._engine().url), self._engine().begin() as conn:
                self._write(conn, firing, saga_id=fired.saga_id, error=error)
        except ServiceUnavailable as exc:
            log.error("cannot record the tick's run: %s", exc, extra=firing.fields)
        return _count(firing.schedule.name, fired)

    @staticmethod
    def _write(
        conn: Connection, firing: _Firing, *, saga_id: str | None, error: str | None = None
    ) -> None:
        schedule_runs.record(
            conn,
            schedule=firing.schedule.name,
            tick=firing.tick,
            saga_type=firing.schedule.saga_type,
            business_key=firing.key,
            at=firing.now,
            saga_id=saga_id,
            error=error,
            missed_before=firing.missed,
        )

    def forget_runs(self) -> int:
        """Prune runs older than ``runs_keep`` (each schedule's newest stays)."""
        with translated(self._engine().url), self._engine().begin() as conn:
            return schedule_runs.prune(conn, self.clock.now() - self.runs_keep)
