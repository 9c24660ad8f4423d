"""Moving an unfinished saga to another version of its definition (``migrate``).

Versions of a saga type run side by side: new sagas take the newest, running ones keep
theirs. An operator may move one saga to another version when nothing it has done would
mean something else there: every step that has left PENDING must exist in the target
version unchanged (action, compensation, queue, timeout, policies, dependencies,
condition, pivot, human task), so its command ids, the messages in flight and the
compensations to come stay valid. A step not taken (its condition did not hold) has left
PENDING too: another condition could have taken it. What the saga has not reached is
taken from the target: its new steps start PENDING (SKIPPED once compensation has begun,
as ``begin_compensation`` leaves steps never sent), and PENDING steps it lacks are
dropped. A refusal raises ``ActionRefused`` naming the first step that differs and how;
nothing is written.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from saga_tasks.core.decider.decision import Decision
from saga_tasks.core.decider.progress import advance
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import SagaDefinition, Step
from saga_tasks.core.model import SagaState, StepState
from saga_tasks.core.states import TERMINAL_SAGA, SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused, InvalidPayload

MIGRATED = "definition_migrated"
"""The history event of a migration; its detail names the actor and both versions."""

_COMPENSATION_BEGUN = frozenset(
    {
        StepStatus.COMPENSATING,
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATION_FAILED,
        StepStatus.COMPENSATION_SKIPPED,
        StepStatus.SKIPPED,
    }
)


def migrate(
    old: SagaDefinition,
    new: SagaDefinition,
    state: SagaState,
    *,
    actor: str,
    reason: str,
    now: datetime,
) -> Decision:
    """Move ``state`` (a saga of definition ``old``) to ``new.version``; a RUNNING saga goes
    on under ``new`` at once (a new step whose parents have succeeded is sent), or it could
    stall with nothing in flight."""
    if state.saga_type != old.saga_type or state.definition_version != old.version:
        raise ValueError(
            f"definition {old.saga_type} v{old.version} is not the one of saga "
            f"{state.saga_id} ({state.saga_type} v{state.definition_version})"
        )
    _refuse_unless_compatible(old, new, state, actor, reason)
    fresh = _fresh(state)
    steps = {s.name: state.steps.get(s.name, fresh) for s in new.steps}
    added = [s.name for s in new.steps if s.name not in state.steps]
    dropped = [name for name in state.steps if name not in new.by_name]
    tx = Transition(new, replace(state, definition_version=new.version, steps=steps), now)
    tx.changed = True
    said = f"operator {actor.strip()}: {reason.strip()}"
    tx.note(
        MIGRATED,
        reason=said,
        detail={
            "actor": actor.strip(),
            "from_version": old.version,
            "to_version": new.version,
            "added_steps": added,
            "dropped_steps": dropped,
        },
    )
    if tx.status is SagaStatus.RUNNING:
        advance(tx, trigger=said)
    return tx.decision()


def _fresh(state: SagaState) -> StepState:
    """What a step the saga has not reached starts as: PENDING, or SKIPPED once
    compensation has begun."""
    begun = state.status is SagaStatus.COMPENSATING or any(
        st.status in _COMPENSATION_BEGUN and not st.not_taken for st in state.steps.values()
    )
    return StepState(status=StepStatus.SKIPPED if begun else StepStatus.PENDING)


def _refuse_unless_compatible(
    old: SagaDefinition, new: SagaDefinition, state: SagaState, actor: str, reason: str
) -> None:
    if not actor.strip() or not reason.strip():
        raise ActionRefused("a migration needs an actor and a reason")
    if new.saga_type != state.saga_type:
        raise ActionRefused(
            f"cannot migrate a {state.saga_type!r} saga to a definition of {new.saga_type!r}"
        )
    if new.version == old.version:
        raise ActionRefused(f"the saga already runs version {old.version} of {old.saga_type!r}")
    if state.status in TERMINAL_SAGA:
        raise ActionRefused(f"cannot migrate: the saga is {state.status.value}")
    target = f"cannot migrate to version {new.version}"
    for s in old.steps:
        st = state.steps[s.name]
        if st.status is StepStatus.PENDING:
            continue
        there = new.by_name.get(s.name)
        if there is None:
            raise ActionRefused(
                f"{target}: step {s.name!r} is {st.status.value} and version {new.version} "
                "has no such step"
            )
        if _comparable(there) != _comparable(s):
            raise ActionRefused(
                f"{target}: step {s.name!r} is {st.status.value} and differs there "
                f"({differences(s, there)})"
            )
    fresh = _fresh(state)
    for s in new.steps:
        if s.when is None or state.steps.get(s.name, fresh).status is not StepStatus.PENDING:
            continue
        by_hand = sorted(n for n in new.by_name if n in state.steps and state.steps[n].by_hand)
        read = [n for n in by_hand if s in new.read_by(n)]
        if read:
            # Its condition would read null: no branch it chooses between would be taken.
            raise ActionRefused(
                f"{target}: the condition of step {s.name!r} ({s.when}) reads step "
                f"{read[0]!r}, which was done by hand and has no result of its own"
            )
    try:
        new.validate_payload(state.payload)
    except InvalidPayload as exc:  # names fields, never values
        raise ActionRefused(f"{target}: the saga's payload does not fit it ({exc})") from None


def _comparable(s: Step) -> Step:
    """``s`` with what two builds of one definition make differently left out: a human
    step's schema is a validator made per build (of one pydantic model, say), so it is
    compared by its name."""
    return s if s.human is None else replace(s, human=replace(s.human, schema=None))


def differences(a: Step, b: Step) -> str:
    """What makes two steps of one name unequal, field by field: ``timeout 30 s -> 60 s``."""
    a, b = _comparable(a), _comparable(b)
    return "; ".join(
        f"{f.name} {_shown(getattr(a, f.name))} -> {_shown(getattr(b, f.name))}"
        for f in fields(Step)
        if f.compare and getattr(a, f.name) != getattr(b, f.name)
    )


def _shown(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g} s"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, Enum):
        return str(value.value)
    if is_dataclass(value) and type(value).__str__ is object.__str__:  # a policy, a human task
        shown = (f"{f.name}={_shown(getattr(value, f.name))}" for f in fields(value) if f.compare)
        return f"{type(value).__name__}({', '.join(shown)})"
    return "none" if value is None else str(value)
