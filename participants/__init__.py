"""Example participants (orders, inventory, payments) and the order saga that drives them.

Each participant owns a schema of its own: business tables, command ledger, outbox.
"""
