"""Replies: a participant's answer to a step's command, its compensation or its fence.

Each reply is classified: accepted (it moves the saga), duplicate (the step already
answered so), late (the step was given up, done by hand, or moved to a newer
generation), conflicting (it contradicts an earlier answer: the saga goes to a person)
or invalid (it answers nothing this saga sent). Every one is written down.
"""

from __future__ import annotations

from saga_tasks.core.decider.commands import UNANSWERED_COMPENSATION, superseded
from saga_tasks.core.decider.progress import advance, after_pivot
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import LateReplyPolicy
from saga_tasks.core.events import ReplyReceived
from saga_tasks.core.messages import MAX_GENERATIONS
from saga_tasks.core.model import FENCE_FAILED, LATE_FAILURE, LATE_SUCCESS, StepState
from saga_tasks.core.states import (
    FORWARD_SUCCEEDED,
    Classification,
    MessageKind,
    Outcome,
    SagaStatus,
    StepStatus,
)


def on_reply(tx: Transition, event: ReplyReceived) -> None:
    if event.step not in tx.definition.by_name:
        _invalid(tx, event, f"reply names unknown step {event.step!r}")
    elif event.kind is MessageKind.COMMAND:
        _forward_reply(tx, event)
    elif event.kind is MessageKind.COMPENSATION:
        _compensation_reply(tx, event)
    else:
        _invalid(tx, event, f"a {event.kind.value} message is not a reply")


# -- the forward command --------------------------------------------------------------------


def _forward_reply(tx: Transition, event: ReplyReceived) -> None:
    name = event.step
    st = tx.steps[name]
    if st.command_id is None or event.command_id != st.command_id:
        _earlier_command_reply(tx, event, st)
        return
    success = event.outcome is Outcome.SUCCESS
    if st.by_hand:
        _late(
            tx,
            event,
            f"late {event.outcome.value}: the step was done by hand; its fence "
            "undoes the command or refuses it",
        )
        return
    if st.status is StepStatus.REQUESTED:
        _forward_answered(tx, event, st)
        return
    if st.given_up:
        _late_forward_reply(tx, event, st)
        return
    if (success and st.status in FORWARD_SUCCEEDED) or (
        not success and st.status is StepStatus.FAILED
    ):
        _duplicate(tx, event, f"step {name!r} already answered {event.outcome.value}")
        return
    said = "success" if st.status in FORWARD_SUCCEEDED else "failure"
    _conflict(tx, event, f"step {name!r} answered {said}, now {event.outcome.value}")


def _earlier_command_reply(tx: Transition, event: ReplyReceived, st: StepState) -> None:
    """A reply to a command id the step no longer awaits: one an operator's retry
    superseded, or none this saga sent."""
    name = event.step
    generation = superseded(tx.before, name, MessageKind.COMMAND, event.command_id, st)
    if generation is None:
        _invalid(tx, event, f"reply to command {event.command_id} which step {name!r} did not send")
    else:
        _late(tx, event, f"reply {event.outcome.value} to a command an operator retry superseded")


def _forward_answered(tx: Transition, event: ReplyReceived, st: StepState) -> None:
    """The answer the step awaits: it succeeded or failed, and the saga moves on."""
    name = event.step
    tx.changed = True
    if event.outcome is Outcome.SUCCESS:
        tx.set_step(
            name,
            st.evolve(status=StepStatus.SUCCEEDED, finished_at=tx.now, result=event.result or {}),
            "step_succeeded",
            message_id=event.message_id,
        )
    else:
        code = event.error_code or "failed"
        failed = st.evolve(status=StepStatus.FAILED, finished_at=tx.now, error=code, deadline=None)
        s = tx.definition.step(name)
        reason = _error_text(event)
        if after_pivot(tx, s) and _retries_left(st, s.retry.max_attempts):
            # After the pivot nothing is undone: the step is sent again, as a new
            # command (the participant would repeat its refusal of this one).
            failed = failed.evolve(
                deadline=tx.now + s.retry.wait(s.timeout, st.attempt + 1, st.command_id or "")
            )
            reason += f"; after the pivot: sent again as a new command at {failed.deadline}"
        tx.set_step(name, failed, "step_failed", message_id=event.message_id, reason=reason)
    advance(tx, trigger=f"step {name!r} failed: {_error_text(event)}")


def _retries_left(st: StepState, max_attempts: int) -> bool:
    return st.attempt < max_attempts and st.generation < MAX_GENERATIONS


def _late_forward_reply(tx: Transition, event: ReplyReceived, st: StepState) -> None:
    """A reply to a step that was given up; every one is written down."""
    name = event.step
    step = tx.definition.step(name)
    tx.classification = Classification.LATE
    if event.outcome is not Outcome.SUCCESS:
        what = "late failure: the command did not take effect"
    elif st.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATED):
        what = "late success: the compensation sent when it was given up undoes it"
    elif st.status is StepStatus.COMPENSATION_FAILED:
        what = "late success: its compensation failed; the saga waits for a person"
    elif step.late_reply is LateReplyPolicy.MANUAL_REVIEW or not step.compensable:
        what = "late success: the step was given up; a person must decide"
    else:
        what = "late success ignored by the step's late-reply policy"
    if st.status is StepStatus.TIMED_OUT and st.error not in (LATE_SUCCESS, LATE_FAILURE):
        # Kept on the step, so an operator's retry takes this answer instead of
        # asking again (the participant would only repeat it, and the inbox drop it).
        success = event.outcome is Outcome.SUCCESS
        tx.set_step(
            name,
            st.evolve(
                error=LATE_SUCCESS if success else LATE_FAILURE,
                result=(event.result or {}) if success else st.result,
            ),
            "late_reply",
            message_id=event.message_id,
            reason=what,
        )
    else:
        tx.note("late_reply", step=name, message_id=event.message_id, reason=what)
    if (
        event.outcome is Outcome.SUCCESS
        and st.status is StepStatus.TIMED_OUT
        and (step.late_reply is LateReplyPolicy.MANUAL_REVIEW or not step.compensable)
        and tx.status is not SagaStatus.MANUAL_REVIEW
    ):
        tx.manual_review(f"step {name!r} succeeded after it was given up")


# -- the compensation, and the fence --------------------------------------------------------


def _compensation_reply(tx: Transition, event: ReplyReceived) -> None:
    name = event.step
    st = tx.steps[name]
    success = event.outcome is Outcome.SUCCESS
    if st.compensation_id is None or event.command_id != st.compensation_id:
        _earlier_compensation_reply(tx, event, st)
        return
    if st.status is StepStatus.COMPENSATING or (
        success
        and st.status is StepStatus.COMPENSATION_FAILED
        and st.error in UNANSWERED_COMPENSATION
    ):
        _compensation_answered(tx, event, st)
        return
    if not success and st.status is StepStatus.COMPENSATED:
        _late(
            tx,
            event,
            f"compensation of {name!r} refused ({_error_text(event)}), but an "
            "earlier generation already undid the step",
        )
        return
    if (success and st.status is StepStatus.COMPENSATED) or (
        not success and st.status is StepStatus.COMPENSATION_FAILED
    ):
        _duplicate(tx, event, f"compensation of {name!r} already answered {event.outcome.value}")
        return
    _conflict(
        tx,
        event,
        f"compensation of step {name!r} answered {event.outcome.value} "
        f"while the step is {st.status.value}",
    )


def _earlier_compensation_reply(tx: Transition, event: ReplyReceived, st: StepState) -> None:
    """A compensation reply to an id the step no longer awaits: a fence, an earlier
    generation that undid the step after all, or one an operator's retry superseded."""
    name = event.step
    success = event.outcome is Outcome.SUCCESS
    generation = superseded(tx.before, name, MessageKind.COMPENSATION, event.command_id, st)
    if generation is None:
        _invalid(
            tx, event, f"reply to compensation {event.command_id} which step {name!r} did not send"
        )
    elif (
        generation == st.generation - 1
        and st.status is StepStatus.SUCCEEDED
        and (st.fencing or (success and st.error == FENCE_FAILED))
    ):
        _fence_answered(tx, event, st)
    elif success and st.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED):
        # An earlier generation undid the step after all; the newer one, when it
        # arrives, finds that and runs nothing.
        _compensation_done(
            tx, event, st, "an earlier generation of the compensation undid the step"
        )
    else:
        _late(
            tx,
            event,
            f"compensation reply {event.outcome.value} to an id an operator retry superseded",
        )


def _compensation_answered(tx: Transition, event: ReplyReceived, st: StepState) -> None:
    """The answer the compensation awaits (or, for a success, awaited before it was given
    up without an answer): the step is undone, or the refusal goes to a person."""
    name = event.step
    tx.changed = True
    if event.outcome is Outcome.SUCCESS and st.status is StepStatus.COMPENSATION_FAILED:
        # Given up for silence or a dead letter, and then answered: late, and
        # the step is undone all the same.
        tx.classification = Classification.LATE
        _compensation_done(tx, event, st, "its late answer: the step is undone")
    elif event.outcome is Outcome.SUCCESS:
        _compensation_done(tx, event, st, None)
    else:
        tx.set_step(
            name,
            st.evolve(status=StepStatus.COMPENSATION_FAILED, error=event.error_code),
            "compensation_failed",
            message_id=event.message_id,
            reason=_error_text(event),
        )
        tx.manual_review(f"compensation of step {name!r} was refused: {_error_text(event)}")


def _compensation_done(tx: Transition, event: ReplyReceived, st: StepState, by: str | None) -> None:
    """The step is undone: settle it, and go on compensating (or out of review)."""
    tx.set_step(
        event.step,
        st.evolve(status=StepStatus.COMPENSATED, finished_at=tx.now, error=None),
        "step_compensated",
        message_id=event.message_id,
        reason=by,
    )
    # In review the saga stays there (only a person takes it out); the step is
    # settled, so ``compensate`` or ``resolve`` finds it undone.
    advance(tx, trigger="")


def _fence_answered(tx: Transition, event: ReplyReceived, st: StepState) -> None:
    """The compensation sent to fence a command in flight when the step was done by hand."""
    name = event.step
    if event.outcome is Outcome.SUCCESS:
        if st.error == FENCE_FAILED:
            tx.classification = Classification.LATE  # given up, then answered
        tx.set_step(
            name,
            st.evolve(error=None, deadline=None, compensation_attempt=0),
            "fence_confirmed",
            message_id=event.message_id,
            reason="the command in flight when the step was done by hand is fenced: "
            + str((event.result or {}).get("nothing_to_undo") or "its effect was undone"),
        )
        advance(tx, trigger="")
        return
    tx.set_step(
        name,
        st.evolve(error=FENCE_FAILED, deadline=None, compensation_attempt=0),
        "fence_failed",
        message_id=event.message_id,
        reason=_error_text(event),
    )
    tx.manual_review(
        f"step {name!r} was done by hand and the command then in flight could not be "
        f"fenced ({_error_text(event)}): its effect may be doubled"
    )


# -- classifications that change nothing, or only send the saga to a person -----------------


def _late(tx: Transition, event: ReplyReceived, reason: str) -> None:
    tx.classification = Classification.LATE
    tx.note("late_reply", step=event.step, message_id=event.message_id, reason=reason)


def _duplicate(tx: Transition, event: ReplyReceived, reason: str) -> None:
    tx.classification = Classification.DUPLICATE
    tx.note("duplicate_reply", step=event.step, message_id=event.message_id, reason=reason)


def _conflict(tx: Transition, event: ReplyReceived, reason: str) -> None:
    tx.classification = Classification.CONFLICTING
    tx.note("conflicting_reply", step=event.step, message_id=event.message_id, reason=reason)
    if tx.status is not SagaStatus.MANUAL_REVIEW:
        tx.manual_review(f"conflicting replies: {reason}")


def _invalid(tx: Transition, event: ReplyReceived, reason: str) -> None:
    tx.classification = Classification.INVALID
    tx.note("invalid_message", step=event.step, message_id=event.message_id, reason=reason)


def _error_text(event: ReplyReceived) -> str:
    code = event.error_code or "failed"
    return f"{code}: {event.error_message}" if event.error_message else code
