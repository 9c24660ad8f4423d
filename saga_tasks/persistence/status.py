"""Counts for the gauges and the dashboard: sagas by status, held messages waiting."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select, text

from saga_tasks.persistence.tables import held_message, saga_instance


def counts_by_type_and_status(conn: Connection) -> list[tuple[str, str, int]]:
    rows = conn.execute(
        select(saga_instance.c.saga_type, saga_instance.c.status, func.count()).group_by(
            saga_instance.c.saga_type, saga_instance.c.status
        )
    ).all()
    return [(saga_type, status, n) for saga_type, status, n in rows]


def pending_held(conn: Connection) -> dict[str, int]:
    """Held messages waiting for an operator, by holding."""
    rows = conn.execute(
        select(held_message.c.holding, func.count())
        .where(held_message.c.status == "pending")
        .group_by(held_message.c.holding)
    ).all()
    return {str(holding): int(n) for holding, n in rows}


def counts_by_status(conn: Connection) -> dict[str, int]:
    rows = conn.execute(
        select(saga_instance.c.status, func.count()).group_by(saga_instance.c.status)
    ).all()
    return {str(status): int(n) for status, n in rows}


def held_with_sagas(
    conn: Connection, holding: str, status: str | None, limit: int
) -> list[dict[str, Any]]:
    """Held messages newest first, each with its saga's type and status (if known)."""
    stmt = (
        select(held_message, saga_instance.c.saga_type, saga_instance.c.status.label("saga_status"))
        .select_from(
            held_message.outerjoin(saga_instance, saga_instance.c.saga_id == held_message.c.saga_id)
        )
        .where(held_message.c.holding == holding)
        .order_by(held_message.c.id.desc())
        .limit(limit)
    )
    if status is not None:
        stmt = stmt.where(held_message.c.status == status)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def started_by_slot(conn: Connection, bucket_seconds: int, since: datetime) -> list[Any]:
    """(slot, status now, count) of sagas started since ``since``, in slots of
    ``bucket_seconds`` (slot = epoch seconds // bucket)."""
    return list(
        conn.execute(
            text(
                "SELECT floor(extract(epoch FROM created_at) / :b)::bigint AS slot, status, "
                "count(*) FROM saga.saga_instance WHERE created_at >= :since GROUP BY 1, 2"
            ),
            {"b": bucket_seconds, "since": since},
        ).all()
    )


def waiting_for_people(
    conn: Connection, human: list[tuple[str, int, str]], limit: int
) -> list[dict[str, Any]]:
    """Running sagas whose human step (``(saga_type, version, step)``) waits for a
    decision, the longest waiting first: from the running sagas (status index) to their
    step row (primary key)."""
    pairs = ", ".join(f"(:t{i}, :v{i}, :s{i})" for i in range(len(human)))
    params: dict[str, Any] = {"limit": limit}
    for i, (saga_type, version, step) in enumerate(human):
        params |= {f"t{i}": saga_type, f"v{i}": version, f"s{i}": step}
    rows = conn.execute(
        text(
            f"""
            SELECT i.saga_id::text AS saga_id, i.saga_type, i.business_key, s.step,
                   s.requested_at, s.deadline, s.last_error = 'escalated' AS escalated
            FROM (VALUES {pairs}) AS h(saga_type, version, step)
            JOIN saga.saga_instance i
              ON i.status = 'RUNNING' AND i.saga_type = h.saga_type
             AND i.definition_version = h.version
            JOIN saga.saga_step s ON s.saga_id = i.saga_id AND s.step = h.step
            WHERE s.status = 'REQUESTED'
            ORDER BY s.requested_at
            LIMIT :limit
            """  # noqa: S608 - only placeholders are formatted in
        ),
        params,
    )
    return [dict(r._mapping) for r in rows]
