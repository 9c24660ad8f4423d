"""Each saga's secret for its command and message ids (``saga_instance.id_key``).

Ids were derived from the public saga id alone, so whoever could publish a reply could
compute the ids that answer for any step. A saga started from now on keys its ids with
128 random bits kept here; a saga started before keeps its ids (the column stays NULL).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("saga_instance", sa.Column("id_key", sa.Text(), nullable=True), schema="saga")


def downgrade() -> None:
    op.drop_column("saga_instance", "id_key", schema="saga")
