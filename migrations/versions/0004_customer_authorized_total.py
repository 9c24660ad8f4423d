"""Payments keeps a running total of open authorizations on the customer row.

Summing a customer's open authorizations on every authorize grew with their history
(a full scan per payment); the total is kept under the row lock authorize already takes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "customer",
        sa.Column("authorized_cents", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        schema="payments",
    )
    op.execute(
        """UPDATE payments.customer c SET authorized_cents = coalesce(
             (SELECT sum(a.amount_cents) FROM payments."authorization" a
              WHERE a.customer_id = c.customer_id AND a.status = 'AUTHORIZED'), 0)"""
    )


def downgrade() -> None:
    op.drop_column("customer", "authorized_cents", schema="payments")
