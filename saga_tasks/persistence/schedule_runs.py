"""The runs of scheduled sagas: one row per tick a firing reached (``saga.schedule_run``).

A started saga is recorded in the transaction that starts it, so the row and the saga
exist together or not at all. An error never overwrites a tick that started its saga.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert

from saga_tasks.persistence.tables import saga_instance, schedule_run

MAX_ERROR = 500


def record(
    conn: Connection,
    *,
    schedule: str,
    tick: datetime,
    saga_type: str,
    business_key: str,
    at: datetime,
    saga_id: str | None = None,
    error: str | None = None,
    missed_before: int = 0,
) -> None:
    """Write what a firing of ``tick`` did: the saga it started or found, or ``error``."""
    row = schedule_run.c
    stmt = insert(schedule_run).values(
        schedule=schedule,
        tick=tick,
        saga_type=saga_type,
        business_key=business_key,
        saga_id=saga_id,
        started_at=at if saga_id is not None else None,
        fired_at=at,
        firings=1,
        missed_before=missed_before,
        error=None if saga_id is not None else (error or "not started")[:MAX_ERROR],
    )
    new = stmt.excluded
    stmt = stmt.on_conflict_do_update(
        constraint="pk_schedule_run",
        set_={
            "saga_id": func.coalesce(row.saga_id, new.saga_id),
            "started_at": func.coalesce(row.started_at, new.started_at),
            "fired_at": new.fired_at,
            "firings": row.firings + 1,
            "missed_before": func.greatest(row.missed_before, new.missed_before),
            "error": case((row.saga_id.is_(None), new.error), else_=row.error),
        },
    )
    conn.execute(stmt)


def latest(conn: Connection, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The newest run of each named schedule, with its saga's status now."""
    return _newest(conn, names, errors_only=False)


def latest_errors(conn: Connection, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The newest run of each named schedule that started nothing, and why."""
    return _newest(conn, names, errors_only=True)


def _newest(conn: Connection, names: Sequence[str], *, errors_only: bool) -> dict[str, Any]:
    if not names:
        return {}
    run = schedule_run.c
    newest = select(run.schedule, func.max(run.tick).label("tick")).where(
        run.schedule.in_(list(names))
    )
    if errors_only:
        newest = newest.where(run.error.is_not(None))
    picked = newest.group_by(run.schedule).subquery()
    stmt = (
        select(
            run.schedule,
            run.tick,
            run.saga_type,
            run.business_key,
            run.saga_id,
            run.started_at,
            run.fired_at,
            run.firings,
            run.missed_before,
            run.error,
            saga_instance.c.status.label("saga_status"),
        )
        .join(picked, and_(run.schedule == picked.c.schedule, run.tick == picked.c.tick))
        .outerjoin(saga_instance, saga_instance.c.saga_id == run.saga_id)
    )
    return {r["schedule"]: dict(r) for r in conn.execute(stmt).mappings()}


def started(conn: Connection, schedule: str, tick: datetime) -> str | None:
    """The saga the tick started, if a firing of it did (its saga may since be purged:
    the business key alone would let the tick start a second one)."""
    run = schedule_run.c
    found = conn.execute(
        select(run.saga_id).where(
            run.schedule == schedule, run.tick == tick, run.saga_id.is_not(None)
        )
    ).scalar_one_or_none()
    return None if found is None else str(found)


def runs(conn: Connection, schedule: str, limit: int = 100) -> list[dict[str, Any]]:
    """The newest runs of one schedule, newest first."""
    run = schedule_run.c
    stmt = (
        select(schedule_run, saga_instance.c.status.label("saga_status"))
        .outerjoin(saga_instance, saga_instance.c.saga_id == run.saga_id)
        .where(run.schedule == schedule)
        .order_by(run.tick.desc())
        .limit(limit)
    )
    return [dict(r) for r in conn.execute(stmt).mappings()]


def prune(conn: Connection, before: datetime) -> int:
    """Forget runs whose tick is older than ``before``, except each schedule's newest."""
    run = schedule_run.c
    newest = select(run.schedule, func.max(run.tick)).group_by(run.schedule)
    stmt = delete(schedule_run).where(
        run.tick < before, tuple_(run.schedule, run.tick).not_in(newest)
    )
    return conn.execute(stmt).rowcount
