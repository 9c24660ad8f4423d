"""The chaos run: order sagas under injected faults, kills, restarts and a random
operator, then invariants checked from the database (``runner`` drives it)."""
