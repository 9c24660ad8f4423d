"""The record of messages that made no sense (the inbox claim is ``sagas.claim_and_lock``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, insert

from saga_tasks.persistence.tables import invalid_message


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
