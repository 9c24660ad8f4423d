"""What the read views show of held and invalid messages (the sagas themselves: ``readsql``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from saga_tasks.persistence.tables import held_message, invalid_message


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
