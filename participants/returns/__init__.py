"""Returns: a customer's return of an item, from request to refund or rejection.

The return row is keyed by the return's own id, so a second saga for one return is
refused rather than doubled. Notifying the customer is last and cannot be undone: it
only records that the message left (the message itself goes out through the outbox of
a mail service, not here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, DateTime, Integer, Table, Text, select, update
from sqlalchemy.dialects.postgresql import UUID, insert

from participants import MIGRATIONS
from saga_tasks import CommandContext, Participant
from saga_tasks.errors import BusinessRejection

participant = Participant("returns", migrations=MIGRATIONS / "returns")

return_request = Table(
    "return_request",
    participant.metadata,
    Column("return_id", Text, primary_key=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("order_ref", Text, nullable=False),
    Column("customer_id", Text, nullable=False),
    Column("sku", Text, nullable=False),
    Column("qty", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    schema="returns",
)

notification = Table(
    "notification",
    participant.metadata,
    Column("command_id", UUID(as_uuid=False), primary_key=True),
    Column("return_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=False),
    schema="returns",
)


@participant.command("create")
def create(ctx: CommandContext) -> Mapping[str, Any]:
    """Open the return (REQUESTED); a return id another saga holds is refused."""
    p = ctx.payload
    created = ctx.conn.execute(
        insert(return_request)
        .values(
            return_id=p["return_id"],
            saga_id=ctx.saga_id,
            order_ref=p["order_ref"],
            customer_id=p["customer_id"],
            sku=p["sku"],
            qty=int(p["qty"]),
            status="REQUESTED",
            created_at=ctx.now,
            updated_at=ctx.now,
        )
        .on_conflict_do_nothing(index_elements=["return_id"])
        .returning(return_request.c.return_id)
    ).first()
    if created is None:
        raise BusinessRejection("duplicate_return", "this return is already open")
    return {"return_id": p["return_id"]}


@participant.compensation("cancel", undoes="create")
def cancel(ctx: CommandContext) -> Mapping[str, Any]:
    """Cancel the return; one never opened, or already closed, changes nothing."""
    cancelled = ctx.conn.execute(
        update(return_request)
        .where(
            return_request.c.return_id == ctx.payload["return_id"],
            return_request.c.saga_id == ctx.saga_id,
            return_request.c.status == "REQUESTED",
        )
        .values(status="CANCELLED", updated_at=ctx.now)
        .returning(return_request.c.return_id)
    ).first()
    return {"cancelled": cancelled is not None}


def _close(ctx: CommandContext, status: str) -> None:
    ctx.conn.execute(
        update(return_request)
        .where(
            return_request.c.return_id == ctx.payload["return_id"],
            return_request.c.saga_id == ctx.saga_id,
        )
        .values(status=status, updated_at=ctx.now)
    )


@participant.command("notify")
def notify(ctx: CommandContext) -> Mapping[str, Any]:
    """Tell the customer the refund is on its way, and close the return as REFUNDED."""
    _close(ctx, "REFUNDED")
    ctx.conn.execute(
        insert(notification).values(
            command_id=ctx.command_id,
            return_id=ctx.payload["return_id"],
            kind="refunded",
            sent_at=ctx.now,
        )
    )
    sent = ctx.conn.execute(
        select(notification.c.command_id).where(
            notification.c.return_id == ctx.payload["return_id"]
        )
    ).all()
    return {"notified": True, "notifications": len(sent)}


@participant.command("close_rejected")
def close_rejected(ctx: CommandContext) -> Mapping[str, Any]:
    """Close the return as REJECTED: the item went back to the customer."""
    _close(ctx, "REJECTED")
    return {"closed": "REJECTED"}
