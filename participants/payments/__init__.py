"""Payments: authorizes an amount against a customer's credit limit, and voids it.

The decline rule is data: a customer's open authorizations plus this amount must
stay within their credit limit. An unknown customer is declined too. The open total
is kept on the customer row, under the lock every authorize takes, so a payment
costs the same for a customer's first order and their ten-thousandth.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, Integer, Table, Text, select, text, update
from sqlalchemy.dialects.postgresql import UUID, insert

from participants import MIGRATIONS
from saga_tasks import CommandContext, Participant
from saga_tasks.errors import BusinessRejection

# Its handlers write only its own database: the commands its worker holds run in one
# transaction (group commit, ``batch=``).
participant = Participant("payments", migrations=MIGRATIONS / "payments", batch=16)

customer = Table(
    "customer",
    participant.metadata,
    Column("customer_id", Text, primary_key=True),
    Column("credit_limit_cents", Integer, nullable=False),
    Column("authorized_cents", BigInteger, nullable=False, server_default=text("0")),
    schema="payments",
)

authorization = Table(
    "authorization",
    participant.metadata,
    Column("authorization_id", UUID(as_uuid=False), primary_key=True),
    Column("command_id", UUID(as_uuid=False), nullable=False, unique=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("customer_id", Text, nullable=False),
    Column("amount_cents", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("voided_at", DateTime(timezone=True)),
    schema="payments",
)

_AUTHORIZATION_IDS = uuid.UUID("c4b8e6a2-1d3f-4e5a-9b7c-8d2e1f0a3b5c")


@participant.command("authorize")
def authorize(ctx: CommandContext) -> Mapping[str, Any]:
    """Authorize the order's amount, or decline it."""
    customer_id = ctx.payload["customer_id"]
    amount = int(ctx.payload["amount_cents"])
    held = ctx.conn.execute(
        update(customer)
        .where(
            customer.c.customer_id == customer_id,
            customer.c.authorized_cents + amount <= customer.c.credit_limit_cents,
        )
        .values(authorized_cents=customer.c.authorized_cents + amount)
        .returning(customer.c.customer_id)
    ).first()
    if held is None:  # the rare path: say why
        known = ctx.conn.execute(
            select(customer.c.customer_id).where(customer.c.customer_id == customer_id)
        ).first()
        if known is None:
            raise BusinessRejection("unknown_customer", "no payment account for this customer")
        raise BusinessRejection("declined", "credit limit exceeded")
    authorization_id = str(uuid.uuid5(_AUTHORIZATION_IDS, ctx.command_id))
    ctx.conn.execute(
        insert(authorization).values(
            authorization_id=authorization_id,
            command_id=ctx.command_id,
            saga_id=ctx.saga_id,
            customer_id=customer_id,
            amount_cents=amount,
            status="AUTHORIZED",
            created_at=ctx.now,
        )
    )
    return {"authorization_id": authorization_id}


@participant.compensation("void", undoes="authorize")
def void(ctx: CommandContext) -> Mapping[str, Any]:
    """Void the authorization; a voided or missing one changes nothing."""
    voided = ctx.conn.execute(
        update(authorization)
        .where(
            authorization.c.command_id == ctx.command.compensates,
            authorization.c.status == "AUTHORIZED",
        )
        .values(status="VOIDED", voided_at=ctx.now)
        .returning(authorization.c.customer_id, authorization.c.amount_cents)
    ).first()
    if voided is not None:
        ctx.conn.execute(
            update(customer)
            .where(customer.c.customer_id == voided.customer_id)
            .values(authorized_cents=customer.c.authorized_cents - voided.amount_cents)
        )
    return {"voided": voided is not None}


# -- refunds ----------------------------------------------------------------------------------

REFUND_LIMIT_CENTS = 100_000
"""Refunds above this are declined here: a person at finance handles them."""

refund_table = Table(
    "refund",
    participant.metadata,
    Column("return_id", Text, primary_key=True),
    Column("command_id", UUID(as_uuid=False), nullable=False),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("customer_id", Text, nullable=False),
    Column("amount_cents", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("voided_at", DateTime(timezone=True)),
    schema="payments",
)


@participant.command("refund")
def refund(ctx: CommandContext) -> Mapping[str, Any]:
    """Request the refund of a return, once per return id whatever the command: a
    second request for the same return answers with the first one."""
    p = ctx.payload
    amount = int(p["amount_cents"])
    if amount > REFUND_LIMIT_CENTS:
        raise BusinessRejection("declined", "refund above the automatic limit")
    known = ctx.conn.execute(
        select(customer.c.customer_id).where(customer.c.customer_id == p["customer_id"])
    ).first()
    if known is None:
        raise BusinessRejection("unknown_customer", "no payment account for this customer")
    ctx.conn.execute(
        insert(refund_table)
        .values(
            return_id=p["return_id"],
            command_id=ctx.command_id,
            saga_id=ctx.saga_id,
            customer_id=p["customer_id"],
            amount_cents=amount,
            status="REQUESTED",
            created_at=ctx.now,
        )
        .on_conflict_do_nothing(index_elements=["return_id"])
    )
    return {"refund_for": p["return_id"], "amount_cents": amount}


@participant.compensation("void_refund", undoes="refund")
def void_refund(ctx: CommandContext) -> Mapping[str, Any]:
    """Void the refund request; safe when none was made (the payment was never
    captured, or the command never ran: its tombstone refuses it later)."""
    voided = ctx.conn.execute(
        update(refund_table)
        .where(
            refund_table.c.return_id == ctx.payload["return_id"],
            refund_table.c.status == "REQUESTED",
        )
        .values(status="VOIDED", voided_at=ctx.now)
        .returning(refund_table.c.return_id)
    ).first()
    return {"voided": voided is not None}
