"""A held message is one row per delivery, not one per body.

``uq_held_delivery`` made ``(holding, delivery_key)`` unique, and the key digested the
task id header, ``x-death``, ``saga_held_at`` and the body only: two messages parked
without a task id and with the same body (two ``b"garbage"``), even with distinct AMQP
message ids or other headers, were one row, and the second was acked and gone.

Now a delivery RabbitMQ does not flag as redelivered is always a row of its own; the key
digests everything RabbitMQ keeps when it delivers a message again (every property and
header but ``x-delivery-count``, the body), and ``acked`` says the broker processed the
row's ack. A redelivered message (its ack lost in a crash) claims an unacked row of its
key, found through ``ix_held_unacked``, instead of being stored twice. Rows stored
before this revision count as acked.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("uq_held_delivery", "held_message", schema="saga", type_="unique")
    op.add_column(
        "held_message",
        sa.Column("acked", sa.Boolean(), nullable=False, server_default=sa.true()),
        schema="saga",
    )
    op.create_index(
        "ix_held_unacked",
        "held_message",
        ["holding", "delivery_key"],
        schema="saga",
        postgresql_where=sa.text("NOT acked"),
    )


def downgrade() -> None:
    op.drop_index("ix_held_unacked", table_name="held_message", schema="saga")
    op.drop_column("held_message", "acked", schema="saga")
    # Deliveries alike in every byte share a key now: give each but the first its own.
    op.execute(
        "UPDATE saga.held_message h SET delivery_key = h.delivery_key || '#' || h.id "
        "FROM (SELECT id, row_number() OVER (PARTITION BY holding, delivery_key ORDER BY id) "
        "AS n FROM saga.held_message) d WHERE d.id = h.id AND d.n > 1"
    )
    op.create_unique_constraint(
        "uq_held_delivery", "held_message", ["holding", "delivery_key"], schema="saga"
    )
