"""The payments schema: the payments participant's own database: customers and authorizations.

Its business tables, and the command ledger, outbox and redelivery counts the library
creates for a participant.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from saga_tasks.persistence.schema import (
    create_participant_tables,
    create_redelivery_table,
    drop_participant_tables,
)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_participant_tables(op, "payments")
    create_redelivery_table(op, "payments")
    op.create_table(
        "authorization",
        sa.Column("authorization_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("voided_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("authorization_id"),
        sa.UniqueConstraint("command_id"),
        schema="payments",
    )
    # authorized_cents: the customer's open authorizations, kept under the row lock
    # authorize takes, so a payment does not sum the customer's history.
    op.create_table(
        "customer",
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("credit_limit_cents", sa.Integer(), nullable=False),
        sa.Column("authorized_cents", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("customer_id"),
        schema="payments",
    )


def downgrade() -> None:
    op.drop_table("customer", schema="payments")
    op.drop_table("authorization", schema="payments")
    drop_participant_tables(op, "payments")
