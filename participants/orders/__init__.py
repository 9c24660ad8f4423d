"""Orders: creates an order pending, confirms it, or cancels it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, DateTime, Integer, Table, Text, select, update
from sqlalchemy.dialects.postgresql import JSONB, UUID, insert

from participants import MIGRATIONS
from saga_tasks import CommandContext, Participant
from saga_tasks.errors import BusinessRejection

# Its handlers write only its own database: the commands its worker holds run in one
# transaction (group commit, ``batch=``).
participant = Participant("orders", migrations=MIGRATIONS / "orders", batch=16)

orders = Table(
    "orders",
    participant.metadata,
    Column("order_id", UUID(as_uuid=False), primary_key=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False, unique=True),
    Column("customer_id", Text, nullable=False),
    Column("amount_cents", Integer, nullable=False),
    Column("items", JSONB, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    schema="orders",
)

_ORDER_IDS = uuid.UUID("0b7a1d56-8d59-4bb4-9a52-7e2f5c3c1e44")


@participant.command("create")
def create(ctx: CommandContext) -> Mapping[str, Any]:
    """Create the order in PENDING; one order per saga."""
    order_id = str(uuid.uuid5(_ORDER_IDS, ctx.saga_id))
    p = ctx.payload
    ctx.conn.execute(
        insert(orders)
        .values(
            order_id=order_id,
            saga_id=ctx.saga_id,
            customer_id=p["customer_id"],
            amount_cents=p["amount_cents"],
            items=p["items"],
            status="PENDING",
            created_at=ctx.now,
            updated_at=ctx.now,
        )
        .on_conflict_do_nothing(index_elements=["saga_id"])
    )
    return {"order_id": order_id}


@participant.compensation("cancel", undoes="create")
def cancel(ctx: CommandContext) -> Mapping[str, Any]:
    """Cancel the saga's order; cancelling twice, or a missing order, changes nothing."""
    result = ctx.conn.execute(
        update(orders)
        .where(orders.c.saga_id == ctx.saga_id, orders.c.status == "PENDING")
        .values(status="CANCELLED", updated_at=ctx.now)
        .returning(orders.c.order_id)
    ).first()
    return {"cancelled": result is not None}


@participant.command("confirm")
def confirm(ctx: CommandContext) -> Mapping[str, Any]:
    """Confirm a pending order: the point of no return of the order saga."""
    confirmed = ctx.conn.execute(
        update(orders)
        .where(orders.c.saga_id == ctx.saga_id, orders.c.status == "PENDING")
        .values(status="CONFIRMED", updated_at=ctx.now)
        .returning(orders.c.order_id)
    ).first()
    if confirmed is None:  # the rare path: say why
        status = ctx.conn.execute(
            select(orders.c.status).where(orders.c.saga_id == ctx.saga_id)
        ).scalar_one_or_none()
        if status is None:
            raise BusinessRejection("order_not_found", "no order for this saga")
        raise BusinessRejection("order_not_pending", f"order is {status}")
    return {"status": "CONFIRMED"}
