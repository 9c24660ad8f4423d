"""Bulk actions by incident: the run (its verb, its filter, who ran it) and each saga it
reached, keyed by incident and saga, so a run that is killed and run again acts once
per saga.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bulk_run",
        sa.Column("incident", sa.Text(), nullable=False),
        sa.Column("verb", sa.Text(), nullable=False),
        sa.Column("selection", JSONB(), nullable=False),
        sa.Column("options", JSONB(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("incident", name="bulk_run_pkey"),
        schema="saga",
    )
    op.create_table(
        "bulk_item",
        sa.Column("incident", sa.Text(), nullable=False),
        sa.Column("saga_id", UUID(as_uuid=False), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text()),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("incident", "saga_id", name="pk_bulk_item"),
        schema="saga",
    )


def downgrade() -> None:
    op.drop_table("bulk_item", schema="saga")
    op.drop_table("bulk_run", schema="saga")
