"""``saga.redelivery``: how many times each consumer saw a message redelivered (poison)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.persistence.tables import redelivery


def count(conn: Connection, consumer: str, message_id: str) -> int:
    """Count one more redelivery of the message; the count so far."""
    insert = pg_insert(redelivery).values(consumer=consumer, message_id=message_id, count=1)
    upsert = insert.on_conflict_do_update(
        constraint="pk_redelivery",
        set_={"count": redelivery.c.count + 1, "last_at": insert.excluded.last_at},
    ).returning(redelivery.c.count)
    return int(conn.execute(upsert).scalar_one())


def forget(conn: Connection, before: datetime) -> int:
    """Drop the counts last touched before ``before``; the number removed."""
    return int(conn.execute(delete(redelivery).where(redelivery.c.last_at < before)).rowcount)
