"""Sagas on a schedule: one row per tick a firing reached, with its saga or its error.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedule_run",
        sa.Column("schedule", sa.Text(), nullable=False),
        sa.Column("tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("saga_type", sa.Text(), nullable=False),
        sa.Column("business_key", sa.Text(), nullable=False),
        sa.Column("saga_id", UUID(as_uuid=False)),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("firings", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("missed_before", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("error", sa.Text()),
        sa.PrimaryKeyConstraint("schedule", "tick", name="pk_schedule_run"),
        schema="saga",
    )
    op.create_index(
        "ix_schedule_run_error",
        "schedule_run",
        ["schedule", "tick"],
        schema="saga",
        postgresql_where=sa.text("error IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_table("schedule_run", schema="saga")
