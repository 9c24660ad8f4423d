"""Outbox rows: written in the transaction that decided to send, published after its commit."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, Table, TextClause, and_, func, select, text, update

from saga_tasks.core.messages import OutboundMessage
from saga_tasks.persistence import recordset

COLUMNS = ("message_id", "saga_id", "task_name", "queue", "routing_key", "headers", "body")
"""What a writer gives an outbox row; the rest (times, attempts) the table fills in."""


def rows(messages: Sequence[OutboundMessage]) -> str:
    """``messages`` as the JSON parameter of ``insert_sql``."""
    return recordset.encode(
        [
            {
                "message_id": m.message_id,
                "saga_id": m.saga_id,
                "task_name": m.task_name,
                "queue": m.queue,
                "routing_key": m.routing_key,
                "headers": m.headers,
                "body": m.body,
            }
            for m in messages
        ]
    )


@cache
def insert_sql(
    table: Table, param: str = "outbox", also_from: str | None = None, where: str | None = None
) -> str:
    """SQL inserting the rows of ``:param`` (see ``rows``) into the outbox ``table``."""
    return recordset.insert_from(table, COLUMNS, param, also_from=also_from, where=where)


def claim_unpublished(
    conn: Connection, table: Table, *, min_age_seconds: float, limit: int
) -> list[OutboundMessage]:
    """Lock up to ``limit`` unpublished rows older than ``min_age_seconds``, oldest first.

    SKIP LOCKED lets several relays run at once without publishing the same row twice
    in one pass; rows a live transaction is about to publish are young, so left alone.
    """
    stmt = (
        select(table)
        .where(
            and_(
                table.c.published_at.is_(None),
                table.c.created_at
                < func.now() - text("make_interval(secs => :age)").bindparams(age=min_age_seconds),
            )
        )
        .order_by(table.c.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [to_message(row) for row in conn.execute(stmt)]


@cache
def _mark(table: Table, recovered: bool) -> TextClause:
    extra = ", recovered = true" if recovered else ""
    return text(  # identifiers from the table's declaration; values are bound
        f"UPDATE {recordset.qualified(table)} SET published_at = now(), "  # noqa: S608
        f"publish_attempts = publish_attempts + 1{extra} "
        "WHERE message_id = ANY(CAST(:ids AS uuid[]))"
    )


def mark_published(
    conn: Connection, table: Table, message_ids: Sequence[str], *, recovered: bool = False
) -> None:
    """Record a publish; ``recovered`` marks rows that only recovery got out.

    One array parameter, so one statement text whatever the number of ids.
    """
    if message_ids:
        conn.execute(_mark(table, recovered), {"ids": list(message_ids)})


def count_failed_attempt(conn: Connection, table: Table, message_ids: Sequence[str]) -> None:
    if message_ids:
        conn.execute(
            update(table)
            .where(table.c.message_id.in_(message_ids))
            .values(publish_attempts=table.c.publish_attempts + 1)
        )


def oldest_unpublished_age(conn: Connection, table: Table) -> float | None:
    """Seconds since the oldest unpublished row was written, or None when all are out."""
    value = conn.execute(
        select(func.extract("epoch", func.now() - func.min(table.c.created_at))).where(
            table.c.published_at.is_(None)
        )
    ).scalar_one_or_none()
    return float(value) if value is not None else None


def to_message(row: Row[Any]) -> OutboundMessage:
    m = row._mapping
    return OutboundMessage(
        message_id=str(m["message_id"]),
        task_name=m["task_name"],
        queue=m["queue"],
        headers=m["headers"],
        body=m["body"],
        saga_id=str(m["saga_id"]) if m["saga_id"] else None,
        routing_key=m["routing_key"],
    )
