"""Counts of sagas by type and status, sampled by beat: the dashboard's history of counts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "status_sample",
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("saga_type", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("at", "saga_type", "status", name="pk_status_sample"),
        schema="saga",
    )


def downgrade() -> None:
    op.drop_table("status_sample", schema="saga")
