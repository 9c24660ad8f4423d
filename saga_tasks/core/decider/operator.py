"""Operators (``OperatorAction``): what a person may do to a saga.

Retry a step or its compensation, skip a step (done or undone by hand), compensate,
replay a held message, or resolve a saga in MANUAL_REVIEW to a final status. An action
the saga's state does not allow raises ``ActionRefused`` with the reason; nothing is
written.
"""

from __future__ import annotations

from collections.abc import Callable

from saga_tasks.core.decider.commands import (
    UNANSWERED_COMPENSATION,
    Send,
    next_generation,
    send,
)
from saga_tasks.core.decider.progress import (
    advance,
    begin_compensation,
    compensate_ready,
    compensation_begun,
    dispatch_step,
    pivot_passed,
    resume_running,
)
from saga_tasks.core.decider.replay import replay_awaits
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import Step
from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.core.model import FENCING, LATE_FAILURE, LATE_SUCCESS, SKIPPED_BY, StepState
from saga_tasks.core.states import TERMINAL_SAGA, SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused


def on_operator(tx: Transition, a: OperatorAction) -> None:
    if not a.actor.strip() or not a.reason.strip():
        raise ActionRefused("an operator action needs an actor and a reason")
    _VERBS[a.verb](tx, a)


def _retry_step(tx: Transition, a: OperatorAction) -> None:
    _refuse_if_final(tx, "retry a step")
    s, st = _operator_step(tx, a)
    said = _said(a)
    if st.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED):
        tx.note("operator_retry_step", step=s.name, reason=said)
        tx.set_status(SagaStatus.COMPENSATING, tx.reason)
        # A new generation: the participant runs it afresh (its ledger would repeat
        # a refusal stored under the old id) and fences the old id.
        send(tx, s, next_generation(st), Send.COMPENSATION, reason=said)
        return
    ready = st.status is StepStatus.PENDING and _parents_succeeded(tx, s)
    failed_forward = st.status is StepStatus.FAILED and pivot_passed(tx)
    forward_retry = (
        ready
        or failed_forward
        or st.status is StepStatus.REQUESTED
        or (st.status is StepStatus.TIMED_OUT and not st.compensation_id)
    )
    if not forward_retry:
        raise ActionRefused(
            f"step {s.name!r} is {st.status.value}: only a step awaiting its answer or "
            "ready to be sent, given up without compensation, failed after the pivot, "
            "or whose compensation failed can be retried"
        )
    if tx.status is SagaStatus.COMPENSATING or compensation_begun(tx):
        raise ActionRefused("the saga is compensating; retry the compensation or resolve")
    tx.note("operator_retry_step", step=s.name, reason=said)
    resume_running(tx, said)
    if st.error == LATE_SUCCESS:
        # The command answered after it was given up: that answer is the retry's.
        tx.set_step(
            s.name,
            st.evolve(status=StepStatus.SUCCEEDED, given_up=False, error=None, finished_at=tx.now),
            "step_succeeded",
            reason=f"its late success is taken ({said})",
        )
        advance(tx, trigger="")
        return
    retried = st.evolve(given_up=False, deadline=None)
    if st.error == LATE_FAILURE or failed_forward:
        # The participant refused it; asked under the same id it would only repeat that.
        retried = next_generation(retried, forward=True)
    tx.put_step(s.name, retried)
    if ready:
        # Sent as dispatch would: a branch whose condition does not hold is not taken.
        if not dispatch_step(tx, s, retried, reason=said):
            advance(tx, trigger="")
        return
    send(tx, s, retried, Send.FORWARD, reason=said)


def _skip_step(tx: Transition, a: OperatorAction) -> None:
    _refuse_if_final(tx, "skip a step")
    s, st = _operator_step(tx, a)
    if s.human is not None:
        # Done by hand, it would carry no decision: every condition reading it would be
        # false, and the saga could complete with no branch taken.
        raise ActionRefused(
            f"step {s.name!r} waits for a person's decision: give it with signal "
            "(retry the step first if it gave up waiting)"
        )
    if st.status is StepStatus.COMPENSATING or (
        st.status is StepStatus.COMPENSATION_FAILED
        and (st.error in UNANSWERED_COMPENSATION or st.generation > 1)
    ):
        # Undone by hand while a compensation may still run would undo it twice: one
        # in flight, one that had no answer or was dead-lettered, or an earlier
        # generation never fenced (the newer one did not run). A retry fences them.
        raise ActionRefused(
            f"a compensation of step {s.name!r} may still run: wait for its answer, "
            "retry it, or resolve the saga"
        )
    if st.status is StepStatus.COMPENSATION_FAILED:
        _undone_by_hand(tx, a, s, st)
    else:
        _done_by_hand(tx, a, s, st)


def _undone_by_hand(tx: Transition, a: OperatorAction, s: Step, st: StepState) -> None:
    said = _said(a)
    tx.note("operator_skip_step", step=s.name, reason=said)
    tx.set_status(SagaStatus.COMPENSATING, tx.reason)
    tx.set_step(
        s.name,
        st.evolve(status=StepStatus.COMPENSATED, finished_at=tx.now, error=None),
        "step_compensated",
        reason=f"undone by hand ({said})",
    )
    compensate_ready(tx)


def _done_by_hand(tx: Transition, a: OperatorAction, s: Step, st: StepState) -> None:
    said = _said(a)
    failed_forward = st.status is StepStatus.FAILED and pivot_passed(tx)
    skippable = (StepStatus.REQUESTED, StepStatus.TIMED_OUT, StepStatus.PENDING)
    if (st.status not in skippable and not failed_forward) or (
        compensation_begun(tx) or tx.status is SagaStatus.COMPENSATING
    ):
        raise ActionRefused(
            f"step {s.name!r} is {st.status.value}: only a step not yet done (before any "
            "compensation) or a compensation not yet done can be skipped"
        )
    if st.status is StepStatus.PENDING and not _parents_succeeded(tx, s):
        raise ActionRefused(f"step {s.name!r} waits for steps that have not succeeded")
    _refuse_if_read_by_a_condition(tx, s)
    # A command that was sent may still run: unless it is known to have changed
    # nothing, it is fenced (undone if it ran, refused by a tombstone if not).
    # (A step that failed after the pivot answered: its command changed nothing.)
    fence = st.command_id is not None and st.error != LATE_FAILURE and not failed_forward
    if fence and not s.compensable:
        raise ActionRefused(
            f"step {s.name!r} has no compensation, and its command may still take effect; "
            "wait for its answer, or retry it"
        )
    tx.note("operator_skip_step", step=s.name, reason=said)
    resume_running(tx, said)
    done = st.evolve(
        status=StepStatus.SUCCEEDED,
        finished_at=tx.now,
        given_up=False,
        error=None,
        deadline=None,
        result={SKIPPED_BY: a.actor},
    )
    tx.set_step(
        s.name,
        done,
        "step_succeeded",
        reason=f"done by hand ({said})" + ("; the command sent earlier is fenced" if fence else ""),
    )
    if fence:
        send(tx, s, done.evolve(error=FENCING, compensation_attempt=0), Send.FENCE)
    advance(tx, trigger="")


def _refuse_if_read_by_a_condition(tx: Transition, s: Step) -> None:
    """Done by hand, a step has no result of its own (``skipped_by`` stands in): a
    condition still to be decided on it would read null, and every branch it chooses
    between would be passed over, the saga completing with none taken."""
    waiting = [
        r for r in tx.definition.read_by(s.name) if tx.steps[r.name].status is StepStatus.PENDING
    ]
    if waiting:
        reader = waiting[0]
        raise ActionRefused(
            f"step {s.name!r} cannot be done by hand: the condition of step {reader.name!r} "
            f"({reader.when}) reads its result, which a step done by hand does not have; "
            "wait for its answer or retry it (its participant runs a command once), or "
            "compensate or resolve the saga"
        )


def _compensate(tx: Transition, a: OperatorAction) -> None:
    _refuse_if_final(tx, "compensate")
    said = _said(a)
    if tx.status is SagaStatus.COMPENSATING:
        raise ActionRefused("the saga is already compensating")
    if pivot_passed(tx):
        raise ActionRefused(
            f"cannot compensate: the pivot {tx.definition.pivot!r} succeeded, and after it "
            "the saga only goes forward; retry or skip what is left, or resolve"
        )
    # A step that cannot be undone and succeeded (or may have: its answer is awaited)
    # stays done, yet the compensation would undo what it builds on: an order confirmed
    # with its stock released and its payment voided.
    for s in tx.definition.steps:
        st = tx.steps[s.name]
        status = st.status
        if s.compensable or s.human is not None:
            continue  # (a person's decision has no effect to undo)
        if status is StepStatus.TIMED_OUT and st.error == LATE_SUCCESS:
            raise ActionRefused(
                f"cannot compensate: step {s.name!r} cannot be undone and succeeded after "
                "it was given up; what it built on must stay (resolve the saga by hand instead)"
            )
        if status is StepStatus.TIMED_OUT and st.error != LATE_FAILURE:
            # Given up with no answer: its command may still run (queued behind a slow
            # service, or held and replayable), and nothing can fence a step without a
            # compensation. Undoing what it builds on now could leave it done on nothing.
            raise ActionRefused(
                f"cannot compensate: step {s.name!r} cannot be undone and its outcome is "
                "unknown (its command may still run); retry it to learn the outcome (its "
                "participant answers a command once), or resolve the saga by hand"
            )
        if status is StepStatus.REQUESTED:
            raise ActionRefused(
                f"cannot compensate: step {s.name!r} cannot be undone and its answer is "
                "awaited; decide once it has answered (or retry, skip or resolve)"
            )
        if status is StepStatus.SUCCEEDED:
            raise ActionRefused(
                f"cannot compensate: step {s.name!r} cannot be undone and has succeeded; "
                "what it built on must stay (resolve the saga by hand instead)"
            )
    tx.note("operator_compensate", reason=said)
    # What failed to compensate is undone again, as a new generation; what was given
    # up without compensation is undone too. ``compensate_ready`` sends them, children
    # before parents.
    for s in tx.definition.steps:
        st = tx.steps[s.name]
        if st.status is StepStatus.COMPENSATION_FAILED:
            tx.set_step(
                s.name,
                next_generation(st).evolve(status=StepStatus.SUCCEEDED, error=None),
                "compensation_queued",
                reason=said,
            )
    begin_compensation(tx, said, given_up_too=True)


def _replay(tx: Transition, a: OperatorAction) -> None:
    """A held message is published again. What it carries is awaited once more (a
    dead compensation or a given-up command); a saga in review resumes only when
    something is then in flight, so a replay never strands it."""
    said = _said(a)
    tx.note("operator_replay", step=a.step, reason=said)
    s = tx.definition.by_name.get(a.step or "")
    awaits = replay_awaits(tx.before, a.step, a.message_kind, a.command_id)
    if s is not None and awaits is not None and awaits != "in flight":
        st = tx.steps[s.name]
        again = {
            "a dead compensation": st.evolve(status=StepStatus.COMPENSATING, error=None),
            "a given-up command": st.evolve(
                status=StepStatus.REQUESTED, given_up=False, error=None
            ),
            "a fence": st.evolve(error=FENCING, compensation_attempt=1),
        }[awaits]
        tx.set_step(
            s.name,
            again.evolve(deadline=tx.now + s.timeout),
            "replay_awaited",
            reason=f"{awaits}, awaited again ({said})",
        )
    if tx.status is not SagaStatus.MANUAL_REVIEW:
        return
    if not any(x.in_flight for x in tx.steps.values()):
        tx.note(
            "saga_not_resumed",
            reason="the replayed message is not one the saga awaits; it stays in review",
        )
        return
    compensating = compensation_begun(tx) or any(
        x.status is StepStatus.COMPENSATING for x in tx.steps.values()
    )
    if compensating:
        tx.set_status(SagaStatus.COMPENSATING, tx.reason)
    else:
        resume_running(tx, said)
    tx.note("saga_resumed", reason=f"resumed for a replay ({said})")


def _resolve(tx: Transition, a: OperatorAction) -> None:
    if tx.status is not SagaStatus.MANUAL_REVIEW:
        raise ActionRefused(
            f"only a saga in MANUAL_REVIEW can be resolved; this one is {tx.status.value}"
        )
    try:
        final = SagaStatus(a.resolution or "")
    except ValueError:
        final = SagaStatus.MANUAL_REVIEW
    if final not in TERMINAL_SAGA:
        raise ActionRefused("resolve to COMPLETED, COMPENSATED or FAILED")
    said = _said(a)
    tx.note("operator_resolve", reason=said, detail={"resolution": final.value})
    tx.set_status(final, said)
    tx.finished_at = tx.now
    tx.note("saga_resolved", reason=said)


_VERBS: dict[OperatorVerb, Callable[[Transition, OperatorAction], None]] = {
    OperatorVerb.RETRY_STEP: _retry_step,
    OperatorVerb.SKIP_STEP: _skip_step,
    OperatorVerb.COMPENSATE: _compensate,
    OperatorVerb.RESOLVE: _resolve,
    OperatorVerb.REPLAY: _replay,
}


# -- what the verbs share -------------------------------------------------------------------


def _said(a: OperatorAction) -> str:
    return f"operator {a.actor}: {a.reason}"


def _operator_step(tx: Transition, a: OperatorAction) -> tuple[Step, StepState]:
    if not a.step or a.step not in tx.definition.by_name:
        known = ", ".join(tx.definition.by_name)
        raise ActionRefused(f"unknown step {a.step!r}; steps: {known}")
    return tx.definition.step(a.step), tx.steps[a.step]


def _parents_succeeded(tx: Transition, s: Step) -> bool:
    return all(
        tx.steps[p].status is StepStatus.SUCCEEDED or tx.steps[p].not_taken for p in s.depends_on
    )


def _refuse_if_final(tx: Transition, verb: str) -> None:
    if tx.status in TERMINAL_SAGA:
        raise ActionRefused(f"cannot {verb}: the saga is {tx.status.value}")
