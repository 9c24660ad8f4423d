"""Which operator actions a saga's state allows now, asked of the decider itself.

The saga page offers only these. Each action (for each step, or each final status) is
tried on the saga as it was read: the decider is pure, so a try writes and sends
nothing, and one it would refuse is left out with the decider's own reason. The rules
stay where the operator path applies them, ``core.decider.operator``; the page cannot
drift from what an action would meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from saga_tasks.core.decider import decide
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.core.model import SagaState
from saga_tasks.errors import ActionRefused

ACTIONS = (
    (OperatorVerb.RETRY_STEP, "retry-step", "Retry step"),
    (OperatorVerb.SKIP_STEP, "skip-step", "Skip step"),
    (OperatorVerb.COMPENSATE, "compensate", "Compensate"),
    (OperatorVerb.RESOLVE, "resolve", "Resolve"),
)
RESOLUTIONS = ("COMPLETED", "COMPENSATED", "FAILED")


@dataclass(frozen=True)
class Offer:
    """An action the saga allows now; ``choices``: the steps (or final statuses) it
    allows it for, empty for an action that takes none."""

    action: str
    label: str
    choices: tuple[str, ...]


@dataclass(frozen=True)
class Withheld:
    """Why an action (for one step or status, or for all of them) is not offered."""

    label: str
    why: str
    choice: str | None = None


def offers(
    definition: SagaDefinition, state: SagaState, now: datetime
) -> tuple[list[Offer], list[Withheld]]:
    """The actions ``state`` allows, and why each other one is not there."""
    offered: list[Offer] = []
    withheld: list[Withheld] = []
    steps = tuple(s.name for s in definition.steps)
    for verb, action, label in ACTIONS:
        choices: tuple[str | None, ...] = (None,)
        if verb in (OperatorVerb.RETRY_STEP, OperatorVerb.SKIP_STEP):
            choices = steps
        elif verb is OperatorVerb.RESOLVE:
            choices = RESOLUTIONS
        allowed: list[str] = []
        refused: list[tuple[str | None, str]] = []
        for choice in choices:
            try:
                decide(definition, state, _trial(verb, choice), now)
            except ActionRefused as exc:
                refused.append((choice, str(exc)))
            else:
                allowed.append(choice or "")
        if allowed:
            offered.append(Offer(action, label, tuple(c for c in allowed if c)))
        whys = {why for _, why in refused}
        if not allowed and len(whys) == 1:
            withheld.append(Withheld(label, whys.pop()))  # one reason for every choice
        else:
            withheld += [Withheld(label, why, choice) for choice, why in refused]
    return offered, withheld


def _trial(verb: OperatorVerb, choice: str | None) -> OperatorAction:
    """The action as a person would send it, with ``choice`` as its step or status."""
    resolve = verb is OperatorVerb.RESOLVE
    return OperatorAction(
        verb,
        actor="dashboard",
        reason="what the saga allows",
        step=None if resolve else choice,
        resolution=choice if resolve else None,
    )
