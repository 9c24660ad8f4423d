"""``python -m saga_tasks.ops.cli``: the same as ``saga-tasks``."""

from saga_tasks.ops.cli import main

main()
