"""What the read views show: held messages, invalid messages, sagas gone quiet."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from saga_tasks.persistence.tables import held_message, invalid_message, saga_instance


def held_of_saga(conn: Connection, saga_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(held_message).where(held_message.c.saga_id == saga_id).order_by(held_message.c.id)
    )
    return [dict(r._mapping) for r in rows]


def held_messages(
    conn: Connection, holding: str, *, status: str | None, saga_id: str | None, limit: int
) -> list[dict[str, Any]]:
    """Newest first."""
    stmt = select(held_message).where(held_message.c.holding == holding)
    if status:
        stmt = stmt.where(held_message.c.status == status)
    if saga_id:
        stmt = stmt.where(held_message.c.saga_id == saga_id)
    stmt = stmt.order_by(held_message.c.id.desc()).limit(limit)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def invalid_messages(conn: Connection, limit: int) -> list[dict[str, Any]]:
    """Newest first."""
    stmt = select(invalid_message).order_by(invalid_message.c.id.desc()).limit(limit)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def quiet_sagas(
    conn: Connection,
    *,
    statuses: Sequence[str],
    before: datetime,
    saga_type: str | None,
    business_key: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Sagas in ``statuses`` unchanged since ``before``, longest quiet first."""
    c = saga_instance.c
    stmt = (
        select(
            c.saga_id,
            c.saga_type,
            c.business_key,
            c.status,
            c.status_reason,
            c.version,
            c.created_at,
            c.updated_at,
            c.finished_at,
            c.next_wake_at,
        )
        .where(c.status.in_(statuses), c.updated_at < before)
        .order_by(c.updated_at)
        .limit(limit)
    )
    if saga_type is not None:
        stmt = stmt.where(c.saga_type == saga_type)
    if business_key is not None:
        stmt = stmt.where(c.business_key == business_key)
    return [dict(r._mapping) for r in conn.execute(stmt)]
