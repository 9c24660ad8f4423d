"""Redelivery counts: how many times each consumer saw a message redelivered (poison).

The orchestrator counts in ``saga.redelivery``, each participant in its own schema's
(``tables.redelivery_table``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Table, delete
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.persistence.tables import redelivery


def count(conn: Connection, consumer: str, message_id: str, table: Table = redelivery) -> int:
    """Count one more redelivery of the message; the count so far."""
    insert = pg_insert(table).values(consumer=consumer, message_id=message_id, count=1)
    upsert = insert.on_conflict_do_update(
        index_elements=[table.c.consumer, table.c.message_id],
        set_={"count": table.c.count + 1, "last_at": insert.excluded.last_at},
    ).returning(table.c.count)
    return int(conn.execute(upsert).scalar_one())


def forget(conn: Connection, before: datetime, table: Table = redelivery) -> int:
    """Drop the counts last touched before ``before``; the number removed."""
    return int(conn.execute(delete(table).where(table.c.last_at < before)).rowcount)
