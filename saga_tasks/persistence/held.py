"""``saga.held_message``: dead letters and parked messages taken off the broker, and
what operators decided about them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, func, insert, select, update

from saga_tasks.errors import ConfigurationError, InputError
from saga_tasks.persistence.tables import (
    ORCHESTRATOR,
    held_message,
    inbox,
    saga_history,
    saga_instance,
)


def store(conn: Connection, values: Mapping[str, Any], saga_id: str | None) -> int:
    """Store one delivery of a held message, its ack not yet known to be processed
    (``mark_acked``); its id."""
    row = conn.execute(
        insert(held_message)
        .values(**values, saga_id=saga_id, acked=False)
        .returning(held_message.c.id)
    ).one()
    return int(row.id)


def claim_unacked(
    conn: Connection, holding: str, delivery_key: str, *, exclude: Sequence[int] = ()
) -> int | None:
    """The row an earlier pass stored for a message delivered again, its ack lost: one
    stored under the same ``delivery_key`` whose ack is not known to be processed, and
    not one of ``exclude`` (this pass's own, acked on this channel). Marked acked, so no
    other delivery (another intake's, at once: ``SKIP LOCKED``) claims it; its id, or
    None when no such row exists (the message was never stored)."""
    candidate = (
        select(held_message.c.id)
        .where(
            held_message.c.holding == holding,
            held_message.c.delivery_key == delivery_key,
            ~held_message.c.acked,
            held_message.c.id.not_in(list(exclude)),
        )
        .order_by(held_message.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    row = conn.execute(
        update(held_message)
        .where(held_message.c.id == candidate)
        .values(acked=True)
        .returning(held_message.c.id)
    ).first()
    return None if row is None else int(row.id)


def mark_acked(conn: Connection, held_ids: Sequence[int]) -> None:
    """The broker processed these rows' acks: their messages are gone from the queue."""
    if held_ids:
        conn.execute(
            update(held_message)
            .where(held_message.c.id.in_(list(held_ids)), ~held_message.c.acked)
            .values(acked=True)
        )


def set_reason(conn: Connection, held_id: int, reason: str) -> None:
    conn.execute(
        update(held_message).where(held_message.c.id == held_id).values(reason=reason[:1000])
    )


def get(conn: Connection, held_id: int, *, lock: bool = False) -> dict[str, Any]:
    stmt = select(held_message).where(held_message.c.id == held_id)
    row = conn.execute(stmt.with_for_update() if lock else stmt).first()
    if row is None:
        raise InputError(f"no held message {held_id}")
    return dict(row._mapping)


def resolve(
    conn: Connection, held_id: int, *, status: str, at: datetime, actor: str, resolution: str
) -> None:
    """Close a held message as ``replayed`` or ``discarded``, saying who and why."""
    conn.execute(
        update(held_message)
        .where(held_message.c.id == held_id)
        .values(status=status, resolved_at=at, resolved_by=actor, resolution=resolution)
    )


def reply_applied(conn: Connection, message_id: str | None) -> bool:
    """Whether the orchestrator's inbox holds this reply's message id."""
    seen = conn.execute(
        select(inbox.c.message_id).where(
            inbox.c.consumer == ORCHESTRATOR, inbox.c.message_id == message_id
        )
    ).first()
    return seen is not None


def executed(conn: Connection, ledger: Table, command_id: str) -> str | None:
    """What a participant's ledger holds for a command: "kind, outcome", or None.

    ``ConfigurationError`` if this database has no such ledger (the participant's tables
    are in a database of its own that this process was not given)."""
    name = f"{ledger.schema}.{ledger.name}"
    if conn.execute(select(func.to_regclass(name))).scalar() is None:
        raise ConfigurationError(f"no table {name} in this database")
    row = conn.execute(
        select(ledger.c.kind, ledger.c.outcome).where(ledger.c.command_id == command_id)
    ).first()
    return f"{row.kind}, {row.outcome}" if row else None


def note(
    conn: Connection,
    row: Mapping[str, Any],
    event: str,
    *,
    at: datetime,
    actor: str,
    reason: str,
) -> None:
    """A line in the history of the held message's saga, if it has one."""
    if row["saga_id"] is None:
        return
    status = conn.execute(
        select(saga_instance.c.status).where(saga_instance.c.saga_id == row["saga_id"])
    ).scalar_one_or_none()
    if status is None:
        return
    conn.execute(
        insert(saga_history).values(
            saga_id=row["saga_id"],
            at=at,
            event=event,
            step=row["step"],
            status_before=status,
            status_after=status,
            message_id=row["message_id"],
            actor=actor,
            reason=reason[:1000],
            detail={"held_id": row["id"]},
        )
    )
