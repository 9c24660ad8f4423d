"""Samples of how many sagas are in each status: written by beat, read by the dashboard.

Counting the saga table by status costs what the table holds; doing it once a sample
interval, not on every page view, keeps the dashboard's cost independent of the table
and gives it a history: the counts over time, not just now.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, insert, literal, select

from saga_tasks.persistence.tables import saga_instance, status_sample


def take(conn: Connection, now: datetime) -> int:
    """Write one sample (a row per type and status) at ``now``; the rows written."""
    counts = select(
        literal(now).label("at"),
        saga_instance.c.saga_type,
        saga_instance.c.status,
        func.count().label("count"),
    ).group_by(saga_instance.c.saga_type, saga_instance.c.status)
    stmt = (
        insert(status_sample)
        .from_select(["at", "saga_type", "status", "count"], counts)
        .returning(status_sample.c.status)
    )
    return len(conn.execute(stmt).all())


def prune(conn: Connection, before: datetime) -> None:
    conn.execute(delete(status_sample).where(status_sample.c.at < before))


def since(conn: Connection, start: datetime) -> list[dict[str, Any]]:
    """Samples from ``start`` on, summed over types: ``{at, status, count}``, oldest first."""
    stmt = (
        select(status_sample.c.at, status_sample.c.status, func.sum(status_sample.c.count))
        .where(status_sample.c.at >= start)
        .group_by(status_sample.c.at, status_sample.c.status)
        .order_by(status_sample.c.at)
    )
    return [{"at": at, "status": status, "count": int(n)} for at, status, n in conn.execute(stmt)]
