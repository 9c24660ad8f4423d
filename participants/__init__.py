"""Example participants (orders, inventory, payments) and the order saga that drives them.

Each participant owns a schema of its own: business tables, command ledger, outbox. The
example's Alembic chain (``MIGRATIONS``) creates them; the saga schema is the library's.
"""

from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations" / "participants"
"""The example's own Alembic chain: the orders, inventory and payments schemas."""
