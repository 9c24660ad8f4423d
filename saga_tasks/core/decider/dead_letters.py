"""Dead letters (``DeadLettered``, from the intake): a message of the saga that the broker
gave up on.

A step's command in the dead-letter queue gives the step up by its ``on_dead_letter``
policy (compensate, or manual review); a dead compensation, fence or reply needs a
person. A dead message the saga no longer awaits is written down and changes nothing;
a dead reply is awaited only when it answers the command its step waits for now.
"""

from __future__ import annotations

from collections.abc import Callable

from saga_tasks.core.decider.commands import Send, fence_id, send
from saga_tasks.core.decider.deadlines import give_up
from saga_tasks.core.decider.progress import begin_compensation, compensate_ready, forward_only
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import DeadLetterPolicy, Step
from saga_tasks.core.events import DeadLettered
from saga_tasks.core.model import FENCE_FAILED, StepState
from saga_tasks.core.states import Classification, MessageKind, SagaStatus, StepStatus

_Handler = Callable[[Transition, DeadLettered, Step, StepState, str], None]


def on_dead_letter(tx: Transition, e: DeadLettered) -> None:
    reason = f"{e.kind.value} dead-lettered: {e.reason}"
    detail = {"held_id": e.held_id}
    step = tx.definition.by_name.get(e.step or "")
    active = tx.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING)
    if step is None or not active:
        tx.classification = Classification.LATE
        why = "its saga is not active" if step is not None else "it names no step of this saga"
        tx.note("dead_letter_recorded", step=e.step if step else None,
                message_id=e.message_id, reason=f"{reason}; nothing to do: {why}",
                detail=detail)  # fmt: skip
        return
    st = tx.steps[step.name]
    handler = _awaited(tx, e, step, st)
    if handler is None:
        tx.classification = Classification.LATE
        tx.note(
            "dead_letter_recorded",
            step=step.name,
            message_id=e.message_id,
            reason=f"{reason}; the step has moved on ({st.status.value})",
            detail=detail,
        )
        return
    tx.note("dead_lettered", step=step.name, message_id=e.message_id, reason=reason,
            detail=detail)  # fmt: skip
    handler(tx, e, step, st, reason)


def _awaited(tx: Transition, e: DeadLettered, step: Step, st: StepState) -> _Handler | None:
    """How the saga takes the dead message, or None when the step no longer awaits it."""
    if e.kind is MessageKind.COMMAND:
        if st.status is StepStatus.REQUESTED and e.command_id == st.command_id:
            return _dead_command
    elif e.kind is MessageKind.COMPENSATION:
        if st.status is StepStatus.COMPENSATING and e.command_id == st.compensation_id:
            return _dead_compensation
        if st.fencing and e.command_id == fence_id(tx.before, step.name, st):
            return _dead_fence
    elif e.kind is MessageKind.REPLY and e.command_id is not None:
        # Only a reply to what the step awaits now: the saga's id alone is public, its
        # command ids are not (they are keyed with the saga's secret).
        awaited = (
            (StepStatus.REQUESTED, st.command_id),
            (StepStatus.COMPENSATING, st.compensation_id),
        )
        if (st.status, e.command_id) in awaited or (
            st.fencing and e.command_id == fence_id(tx.before, step.name, st)
        ):
            return _dead_reply
    return None


def _dead_command(tx: Transition, e: DeadLettered, step: Step, st: StepState, reason: str) -> None:
    tx.changed = True
    if step.on_dead_letter is DeadLetterPolicy.MANUAL_REVIEW:
        # The step still awaits its answer: replaying the message resumes the saga.
        tx.manual_review(f"step {step.name!r}: {reason}")
        return
    give_up(tx, step, "its command was dead-lettered")
    if forward_only(tx, step):
        why = "it follows the pivot" if step.compensable else "it cannot be undone"
        tx.manual_review(f"step {step.name!r}: {reason}; {why}")
        return
    send(tx, step, tx.steps[step.name], Send.COMPENSATION)
    if tx.status is SagaStatus.RUNNING:
        begin_compensation(tx, f"step {step.name!r}: {reason}")
    else:
        compensate_ready(tx)


def _dead_compensation(
    tx: Transition, e: DeadLettered, step: Step, st: StepState, reason: str
) -> None:
    tx.set_step(
        step.name,
        st.evolve(status=StepStatus.COMPENSATION_FAILED, error="dead_lettered"),
        "compensation_failed",
        reason=reason,
    )
    tx.manual_review(f"compensation of step {step.name!r}: {reason}")


def _dead_fence(tx: Transition, e: DeadLettered, step: Step, st: StepState, reason: str) -> None:
    tx.set_step(
        step.name,
        st.evolve(error=FENCE_FAILED, deadline=None, compensation_attempt=0),
        "fence_failed",
        reason=reason,
    )
    tx.manual_review(
        f"step {step.name!r} was done by hand and the fence of the command then in "
        f"flight was dead-lettered ({e.reason}): replay it, or undo the command by hand"
    )


def _dead_reply(tx: Transition, e: DeadLettered, step: Step, st: StepState, reason: str) -> None:
    tx.manual_review(f"a reply of step {step.name!r} could not be applied: {e.reason}")
