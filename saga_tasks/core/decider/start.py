"""The start of a saga: its deadline is set and its root steps are sent."""

from __future__ import annotations

from saga_tasks.core.decider.progress import advance
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.states import Classification


def on_started(tx: Transition) -> None:
    if tx.before.version != 0:
        tx.classification = Classification.DUPLICATE
        tx.note("duplicate_start", reason="the saga was already started")
        return
    tx.changed = True
    tx.deadline = tx.now + tx.definition.timeout
    tx.note("saga_started", detail={"deadline": tx.deadline.isoformat()})
    advance(tx, trigger="")  # (a saga whose every step is not taken completes at once)
