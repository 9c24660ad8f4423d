"""The orchestrator's inbox and its record of messages that made no sense."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, insert
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.persistence.tables import inbox, invalid_message


def claim(conn: Connection, consumer: str, message_id: str, saga_id: str | None) -> bool:
    """Record a message as consumed; False means it was consumed before (a duplicate).

    A concurrent delivery of the same message blocks on the key until this
    transaction ends, then sees the conflict: the key, not timing, decides.
    """
    stmt = (
        pg_insert(inbox)
        .values(consumer=consumer, message_id=message_id, saga_id=saga_id)
        .on_conflict_do_nothing(index_elements=["consumer", "message_id"])
        .returning(inbox.c.message_id)
    )
    return conn.execute(stmt).first() is not None


def record_invalid(
    conn: Connection,
    *,
    consumer: str,
    reason: str,
    queue: str | None,
    routing_key: str | None,
    task_name: str | None,
    message_id: str | None,
    saga_id: str | None,
    headers: Mapping[str, Any],
    body_sha256: str | None,
    body_size: int | None,
) -> None:
    conn.execute(
        insert(invalid_message).values(
            consumer=consumer,
            reason=reason[:1000],
            queue=queue,
            routing_key=routing_key,
            task_name=task_name,
            message_id=message_id,
            saga_id=saga_id,
            headers=dict(headers),
            body_sha256=body_sha256,
            body_size=body_size,
        )
    )
