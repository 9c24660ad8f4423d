"""Inventory: reserves stock for an order's items and releases it.

Stock rows are locked in SKU order, so two reservations never deadlock. An unknown
SKU or too little stock is a business failure; a partial reservation is rolled back
with the transaction (the framework records the refusal in a new one).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import CheckConstraint, Column, DateTime, Integer, Table, Text, select, update
from sqlalchemy.dialects.postgresql import JSONB, UUID, insert

from participants import MIGRATIONS
from saga_tasks import CommandContext, Participant
from saga_tasks.errors import BusinessRejection

# Its handlers write only its own database: the commands its worker holds run in one
# transaction (group commit, ``batch=``).
participant = Participant("inventory", migrations=MIGRATIONS / "inventory", batch=16)

stock = Table(
    "stock",
    participant.metadata,
    Column("sku", Text, primary_key=True),
    Column("on_hand", Integer, nullable=False),
    Column("reserved", Integer, nullable=False),
    CheckConstraint("reserved >= 0 AND reserved <= on_hand", name="ck_stock_reserved"),
    schema="inventory",
)

reservation = Table(
    "reservation",
    participant.metadata,
    Column("reservation_id", UUID(as_uuid=False), primary_key=True),
    Column("command_id", UUID(as_uuid=False), nullable=False, unique=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("items", JSONB, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("released_at", DateTime(timezone=True)),
    schema="inventory",
)

_RESERVATION_IDS = uuid.UUID("5a0e1c2b-7b39-4d8f-a4a2-31f6f6f0c9d3")


def _quantities(items: Any) -> dict[str, int]:
    wanted: dict[str, int] = {}
    for item in items:
        wanted[item["sku"]] = wanted.get(item["sku"], 0) + int(item["qty"])
    return wanted


@participant.command("reserve")
def reserve(ctx: CommandContext) -> Mapping[str, Any]:
    """Reserve every item of the order, or none."""
    wanted = _quantities(ctx.payload["items"])
    for sku, qty in sorted(wanted.items()):  # in SKU order: two reservations never deadlock
        taken = ctx.conn.execute(
            update(stock)
            .where(stock.c.sku == sku, stock.c.on_hand - stock.c.reserved >= qty)
            .values(reserved=stock.c.reserved + qty)
            .returning(stock.c.sku)
        ).first()
        if taken is None:  # the rare path: say why (the transaction is rolled back)
            row = ctx.conn.execute(
                select(stock.c.on_hand, stock.c.reserved).where(stock.c.sku == sku)
            ).first()
            if row is None:
                raise BusinessRejection("unknown_sku", f"{sku} is not stocked")
            raise BusinessRejection(
                "out_of_stock", f"{sku}: {row.on_hand - row.reserved} free, {qty} asked"
            )
    reservation_id = str(uuid.uuid5(_RESERVATION_IDS, ctx.command_id))
    ctx.conn.execute(
        insert(reservation).values(
            reservation_id=reservation_id,
            command_id=ctx.command_id,
            saga_id=ctx.saga_id,
            items=[{"sku": s, "qty": q} for s, q in sorted(wanted.items())],
            status="RESERVED",
            created_at=ctx.now,
        )
    )
    return {"reservation_id": reservation_id}


@participant.compensation("release", undoes="reserve")
def release(ctx: CommandContext) -> Mapping[str, Any]:
    """Give back what the reservation holds; a released or missing one changes nothing."""
    row = ctx.conn.execute(
        select(reservation.c.reservation_id, reservation.c["items"])
        .where(
            reservation.c.command_id == ctx.command.compensates, reservation.c.status == "RESERVED"
        )
        .with_for_update()
    ).first()
    if row is None:
        return {"released": False}
    for sku, qty in sorted(_quantities(row._mapping["items"]).items()):
        ctx.conn.execute(
            update(stock).where(stock.c.sku == sku).values(reserved=stock.c.reserved - qty)
        )
    ctx.conn.execute(
        update(reservation)
        .where(reservation.c.reservation_id == row.reservation_id)
        .values(status="RELEASED", released_at=ctx.now)
    )
    return {"released": True, "reservation_id": row.reservation_id}


# -- returned items ---------------------------------------------------------------------------

returned_item = Table(
    "returned_item",
    participant.metadata,
    Column("return_id", Text, primary_key=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("sku", Text, nullable=False),
    Column("qty", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    schema="inventory",
)


@participant.command("receive")
def receive(ctx: CommandContext) -> Mapping[str, Any]:
    """Take the returned item in at the warehouse (RECEIVED)."""
    p = ctx.payload
    ctx.conn.execute(
        insert(returned_item)
        .values(
            return_id=p["return_id"],
            saga_id=ctx.saga_id,
            sku=p["sku"],
            qty=int(p["qty"]),
            status="RECEIVED",
            received_at=ctx.now,
            updated_at=ctx.now,
        )
        .on_conflict_do_nothing(index_elements=["return_id"])
    )
    return {"received": p["return_id"]}


@participant.compensation("flag_for_inspection", undoes="receive")
def flag_for_inspection(ctx: CommandContext) -> Mapping[str, Any]:
    """An item cannot be un-received: when the return fails later it is flagged for a
    person to look at (FLAGGED); one never received changes nothing."""
    flagged = ctx.conn.execute(
        update(returned_item)
        .where(
            returned_item.c.return_id == ctx.payload["return_id"],
            returned_item.c.saga_id == ctx.saga_id,
            returned_item.c.status == "RECEIVED",
        )
        .values(status="FLAGGED", updated_at=ctx.now)
        .returning(returned_item.c.return_id)
    ).first()
    return {"flagged": flagged is not None}


def _move_returned(ctx: CommandContext, status: str) -> Any:
    return ctx.conn.execute(
        update(returned_item)
        .where(
            returned_item.c.return_id == ctx.payload["return_id"],
            returned_item.c.saga_id == ctx.saga_id,
            returned_item.c.status == "RECEIVED",
        )
        .values(status=status, updated_at=ctx.now)
        .returning(returned_item.c.sku, returned_item.c.qty)
    ).first()


@participant.command("restock")
def restock(ctx: CommandContext) -> Mapping[str, Any]:
    """Put the accepted item back on the shelf: it can be sold again (cannot be undone)."""
    moved = _move_returned(ctx, "RESTOCKED")
    if moved is not None:
        ctx.conn.execute(
            update(stock)
            .where(stock.c.sku == moved.sku)
            .values(on_hand=stock.c.on_hand + moved.qty)
        )
    return {"restocked": moved is not None}


@participant.command("send_back")
def send_back(ctx: CommandContext) -> Mapping[str, Any]:
    """Ship the rejected item back to the customer (cannot be undone)."""
    return {"sent_back": _move_returned(ctx, "SENT_BACK") is not None}
