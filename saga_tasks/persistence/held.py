"""``saga.held_message``: dead letters and parked messages taken off the broker, and
what operators decided about them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.errors import ConfigurationError, InputError
from saga_tasks.persistence.tables import (
    ORCHESTRATOR,
    held_message,
    inbox,
    saga_history,
    saga_instance,
)


def insert_new(conn: Connection, values: Mapping[str, Any], saga_id: str | None) -> int | None:
    """Store a held message once per delivery; its id, or None when stored before."""
    row = conn.execute(
        pg_insert(held_message)
        .values(**values, saga_id=saga_id)
        .on_conflict_do_nothing(constraint="uq_held_delivery")
        .returning(held_message.c.id)
    ).first()
    return None if row is None else int(row.id)


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
