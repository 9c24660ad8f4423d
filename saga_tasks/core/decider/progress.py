"""Progress: moving a saga as far as its step states allow, forward or back.

Forward, every step whose parents have all settled is looked at (fan-out), and a step
waits for all of its parents (fan-in). A step whose condition does not hold, or none of
whose parents was taken, is not taken (``SKIPPED``); a fan-in after a branch waits only
for the steps that were taken. Back, once a step failed, steps never sent are skipped
and every succeeded step is undone, children before parents; a step still in flight is
undone once it answers, and a step without a compensation stays done. Once the pivot
succeeded, nothing is undone: the saga only goes forward.
"""

from __future__ import annotations

from typing import Any

from saga_tasks.core.decider.commands import Send, send
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import LateReplyPolicy, Step
from saga_tasks.core.model import LATE_SUCCESS, NOT_TAKEN, StepState
from saga_tasks.core.states import SagaStatus, StepStatus

_HOLDS_AN_EFFECT = (
    StepStatus.REQUESTED,
    StepStatus.SUCCEEDED,
    StepStatus.COMPENSATING,
    StepStatus.COMPENSATION_FAILED,
)
"""A step in one of these may hold an effect that its parents' compensation must follow."""


def advance(tx: Transition, trigger: str) -> None:
    """Move the saga as far as its step states allow."""
    if tx.status is SagaStatus.RUNNING:
        failed = [
            n
            for n, st in tx.steps.items()
            if st.status is StepStatus.FAILED and not st.awaits_retry
        ]
        if failed and pivot_passed(tx):
            tx.manual_review(
                f"step {failed[0]!r} failed after the pivot {tx.definition.pivot!r}: nothing "
                "is compensated after it; retry the step, skip it or resolve"
            )
        elif failed:
            begin_compensation(tx, trigger)
        else:
            dispatch_ready(tx)
            unfenced = [n for n, st in tx.steps.items() if st.unfenced]
            if all(
                (st.status is StepStatus.SUCCEEDED and not st.fencing) or st.not_taken
                for st in tx.steps.values()
            ):
                if unfenced:
                    tx.manual_review(
                        f"step {unfenced[0]!r} was done by hand and the fence of the command "
                        "then in flight failed: its effect may be doubled; replay the fence, "
                        "or undo the command by hand and resolve"
                    )
                else:
                    finish(tx, SagaStatus.COMPLETED, "saga_completed")
            elif not any(st.pending for st in tx.steps.values()):
                # Steps given up earlier (their outcome unknown) hold the rest back.
                held = [n for n, st in tx.steps.items() if st.status is StepStatus.TIMED_OUT]
                tx.manual_review(
                    f"step {held[0]!r} was given up and nothing else is in flight: retry "
                    "it, skip it, compensate or resolve"
                    if held
                    else "nothing is in flight and the saga cannot finish"
                )
            return
    if tx.status is SagaStatus.COMPENSATING:
        compensate_ready(tx)


def pivot_passed(tx: Transition) -> bool:
    """The saga's pivot succeeded before any compensation began: from here on it only
    goes forward. A pivot that answers success once the saga compensates (a failure
    came first; it answered in review, say) is undone like any step."""
    pivot = tx.definition.pivot
    return (
        pivot is not None
        and tx.steps[pivot].status is StepStatus.SUCCEEDED
        and tx.status is not SagaStatus.COMPENSATING
        and not compensation_begun(tx)
    )


_COMPENSATION_BEGUN = (
    StepStatus.COMPENSATING,
    StepStatus.COMPENSATED,
    StepStatus.COMPENSATION_FAILED,
    StepStatus.COMPENSATION_SKIPPED,
    StepStatus.SKIPPED,
)


def child_holding_an_effect(tx: Transition, name: str) -> str | None:
    """A step depending on ``name`` (directly or not) that may still hold an effect: the
    compensation of ``name`` must follow its own."""
    below = tx.definition.descendants(name)
    for d in tx.definition.steps:  # definition order: the answer does not vary
        st = tx.steps[d.name]
        if d.name in below and (st.status in _HOLDS_AN_EFFECT or st.fencing):
            return d.name
    return None


def compensation_begun(tx: Transition) -> bool:
    """A step was undone, is being undone, or was skipped because the saga compensates
    (a step not taken by its condition was not)."""
    return any(st.status in _COMPENSATION_BEGUN and not st.not_taken for st in tx.steps.values())


def after_pivot(tx: Transition, s: Step) -> bool:
    """The pivot succeeded and the step is not one it built on: the step only goes
    forward (a step of another branch included)."""
    pivot = tx.definition.pivot
    return (
        pivot is not None
        and s.name != pivot
        and pivot_passed(tx)
        and s.name not in tx.definition.ancestors(pivot)
    )


def forward_only(tx: Transition, s: Step) -> bool:
    """The step is never given up nor undone: it cannot be, or it follows a pivot that
    succeeded. Silence sends it again; a dead letter or a spent failure calls a person."""
    return not s.compensable or after_pivot(tx, s)


def dispatch_ready(tx: Transition) -> None:
    """Send (or, by its condition, pass over) every pending step whose parents have all
    settled; definition order is a dependency order, so a branch not taken is passed
    over to its end in one pass."""
    for s in tx.definition.steps:
        st = tx.steps[s.name]
        if st.status is not StepStatus.PENDING:
            continue
        parents = [tx.steps[p] for p in s.depends_on]
        if all(p.status is StepStatus.SUCCEEDED or p.not_taken for p in parents):
            dispatch_step(tx, s, st)


def dispatch_step(tx: Transition, s: Step, st: StepState, reason: str | None = None) -> bool:
    """Send a pending step whose parents have settled, or pass it over as not taken
    (none of its parents was taken, or its condition does not hold); True if sent."""
    parents = [tx.steps[p] for p in s.depends_on]
    if parents and all(p.not_taken for p in parents):
        _not_taken(tx, s, st, "none of the steps it depends on was taken")
        return False
    if s.when is not None and not s.when.holds(tx.before.payload, _results(tx)):
        _not_taken(tx, s, st, f"its condition does not hold: {s.when}")
        return False
    if s.when is not None:
        tx.note(
            "condition_held",
            step=s.name,
            reason=f"its condition holds: {s.when}",
            detail={"condition": str(s.when)},
        )
    send(tx, s, st, Send.FORWARD, reason=reason)
    return True


def _not_taken(tx: Transition, s: Step, st: StepState, why: str) -> None:
    tx.set_step(
        s.name,
        st.evolve(status=StepStatus.SKIPPED, error=NOT_TAKEN),
        "step_not_taken",
        reason=why,
        detail={"condition": str(s.when)} if s.when is not None else {},
    )


def _results(tx: Transition) -> dict[str, Any]:
    return {
        n: st.result
        for n, st in tx.steps.items()
        if st.result is not None and st.status is StepStatus.SUCCEEDED
    }


def resume_running(tx: Transition, said: str) -> None:
    """An operator sends the saga forward again; a deadline that passed while it
    waited for a person is renewed, or the next sweep would undo what was just sent."""
    tx.set_status(SagaStatus.RUNNING, None)
    if tx.deadline is not None and tx.deadline <= tx.now:
        tx.deadline = tx.now + tx.definition.timeout
        tx.note(
            "deadline_renewed",
            reason=f"the saga's deadline had passed; now {tx.deadline.isoformat()} ({said})",
        )


def finish(tx: Transition, status: SagaStatus, event: str) -> None:
    # A compensated saga keeps the reason it was compensated for.
    tx.set_status(status, tx.reason if status is SagaStatus.COMPENSATED else None)
    tx.finished_at = tx.now
    tx.note(event)


def begin_compensation(tx: Transition, reason: str, *, given_up_too: bool = False) -> None:
    tx.set_status(SagaStatus.COMPENSATING, reason)
    never_sent = [n for n, st in tx.steps.items() if st.status is StepStatus.PENDING]
    for name in never_sent:
        tx.put_step(name, tx.steps[name].evolve(status=StepStatus.SKIPPED))
    for s in tx.definition.steps:
        st = tx.steps[s.name]
        if s.human is not None and st.status is StepStatus.REQUESTED:
            # A decision not yet made has no effect to undo: nobody waits for it any more.
            tx.set_step(
                s.name,
                st.evolve(status=StepStatus.SKIPPED, deadline=None, error=None, finished_at=None),
                "signal_withdrawn",
                reason="the saga compensates; the decision is no longer needed",
            )
    tx.note(
        "compensation_started",
        reason=reason,
        detail={"skipped_steps": never_sent} if never_sent else {},
    )
    compensate_ready(tx, given_up_too=given_up_too)


def compensate_ready(tx: Transition, *, given_up_too: bool = False) -> None:
    """Undo every succeeded step none of whose descendants still holds an effect, and
    every step given up whose policy undoes it (any, with ``given_up_too``: an
    operator's ``compensate``); then end the saga, or hand it to a person, if nothing
    more will answer."""
    _send_ready_compensations(tx, given_up_too=given_up_too)
    if not any(st.status in _HOLDS_AN_EFFECT or st.fencing for st in tx.steps.values()):
        _settle(tx)
        return
    failed = [n for n, st in tx.steps.items() if st.status is StepStatus.COMPENSATION_FAILED]
    if (
        failed
        and tx.status is SagaStatus.COMPENSATING
        and not any(st.in_flight for st in tx.steps.values())
    ):
        # Nothing more will answer: what is left needs a person.
        tx.manual_review(
            f"compensation of step {failed[0]!r} failed ({tx.steps[failed[0]].error}) "
            "and nothing else is in flight"
        )


def _send_ready_compensations(tx: Transition, *, given_up_too: bool) -> None:
    # Reverse dependency order: a child is settled before its parent is looked at.
    for s in reversed(tx.definition.steps):
        st = tx.steps[s.name]
        if (
            st.status is StepStatus.TIMED_OUT
            and s.compensable
            and (given_up_too or s.late_reply is LateReplyPolicy.COMPENSATE)
            and st.compensation_id is None
        ):
            # Given up while a person was needed elsewhere: it may have taken effect.
            send(tx, s, st, Send.COMPENSATION)
            continue
        if st.status is not StepStatus.SUCCEEDED or st.fencing:
            continue  # a fence answers first; then the step is compensated like any
        if child_holding_an_effect(tx, s.name) is not None:
            continue
        if s.compensable:
            send(tx, s, st, Send.COMPENSATION)
        else:
            tx.set_step(
                s.name,
                st.evolve(status=StepStatus.COMPENSATION_SKIPPED),
                "compensation_skipped",
                reason=f"step {s.name!r} has no compensation; its effect stays",
            )


def _settle(tx: Transition) -> None:
    """Nothing holds an effect any more: the saga is compensated, unless a step that
    succeeded after it was given up keeps its effect and a person must decide."""
    undecided = [
        s.name
        for s in tx.definition.steps
        if tx.steps[s.name].status is StepStatus.TIMED_OUT
        and tx.steps[s.name].error == LATE_SUCCESS
        and (not s.compensable or s.late_reply is LateReplyPolicy.MANUAL_REVIEW)
    ]
    if undecided:
        if tx.status is not SagaStatus.MANUAL_REVIEW:
            first = tx.definition.step(undecided[0])
            choices = "compensate, or resolve" if first.compensable else "resolve"
            tx.manual_review(
                f"step {first.name!r} succeeded after it was given up and its effect "
                f"stays: a person must decide ({choices})"
            )
        return
    finish(tx, SagaStatus.COMPENSATED, "saga_compensated")
