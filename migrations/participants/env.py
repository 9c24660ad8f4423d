"""Alembic environment of the example: the orders, inventory and payments schemas.

Its version table is ``example.alembic_version``, apart from the library's. The example
app declares this chain (``SagaApp(migrations=[...])``), so ``saga-tasks db upgrade`` runs
it after the saga schema's, in the same transaction.
"""

from __future__ import annotations

from participants import inventory, orders, payments
from saga_tasks.persistence.schema import run_migrations

PARTICIPANTS = (orders.participant, inventory.participant, payments.participant)

run_migrations(
    version_table_schema="example",
    schemas={p.schema for p in PARTICIPANTS},
    target_metadata=[p.metadata for p in PARTICIPANTS],
)
