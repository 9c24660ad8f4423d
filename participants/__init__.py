"""Example participants (orders, inventory, payments) and the order saga that drives them.

Each participant is a service of its own: its database (``SAGA_PARTICIPANT_DATABASE_URL``;
the example gives each a database named after it), its schema there (business tables,
command ledger, outbox, redelivery counts) and its own Alembic chain under
``migrations/<name>``. The saga schema is the library's, in the orchestrator's database.
"""

from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"
"""Where the example participants' Alembic chains are: ``MIGRATIONS / name``."""
