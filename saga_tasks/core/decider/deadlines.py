"""Deadlines (``DeadlinePassed``, from the sweeper): what a saga does about silence.

A step with no answer by its deadline whose queue holds a backlog waits on: the command is
most likely still queued behind it, and the silence is the backlog's, not the
participant's. Its deadline moves on by the step's timeout (history ``resend_deferred``),
for at most ``BACKLOG_PATIENCE`` timeouts since it was last sent;
nothing is sent (a copy would double the work of a backed-up queue) and no attempt is
spent (being slow under load is no reason to give up). Otherwise a step with no answer is
sent again, same command id, until its retry policy is spent; then it is given up, its
outcome unknown, and compensated at once or left ``TIMED_OUT`` by its late-reply policy
while the saga compensates the rest. A step that cannot be undone and gives no answer
puts the saga in MANUAL_REVIEW. A compensation or a fence with no answer is sent again
until its policy is spent; then the saga goes to MANUAL_REVIEW. The saga's own deadline
turns a RUNNING saga to compensation, giving up what is in flight (a backlog or not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from saga_tasks.core.decider.commands import Send, send
from saga_tasks.core.decider.progress import begin_compensation, compensate_ready
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import LateReplyPolicy, Step
from saga_tasks.core.model import StepState
from saga_tasks.core.states import ACTIVE_SAGA, SagaStatus, StepStatus

BACKLOG_PATIENCE = 10
"""A command waits behind a backlog for at most this many of its step's timeouts since it
was last sent; then its silence is the participant's again (sent again, or given up), so
a queue that never drains (no consumer at all) still ends in a decision, and an alert."""


def on_deadline(tx: Transition, backlog: Mapping[str, int] | None = None) -> None:
    """Act on every deadline that has passed; a sweep that finds none changes nothing.
    ``backlog``: messages waiting in each command queue, as the sweeper saw them."""
    if tx.status not in ACTIVE_SAGA:
        return
    due = _find_due(tx, backlog or {})
    _wait_behind_backlogs(tx, due)
    if not _chase_fences(tx, due.fences) or not due.anything:
        return
    # What needs a person is settled first, and then nothing at all is sent.
    if _hand_to_a_person(tx, due):
        return
    _send_again(tx, due)
    _give_up_spent(tx, due)
    if due.running and (due.saga_expired or due.give_up):
        first = due.give_up[0].name if due.give_up else None
        why = due.why if due.saga_expired or first is None else f"step {first!r} had {due.why}"
        begin_compensation(tx, why)
    elif tx.status is SagaStatus.COMPENSATING:
        compensate_ready(tx)


def give_up(tx: Transition, s: Step, why: str) -> None:
    """No answer will be waited for any more: the step's outcome is unknown."""
    st = tx.steps[s.name]
    tx.set_step(
        s.name,
        st.evolve(status=StepStatus.TIMED_OUT, given_up=True, error="timed_out"),
        "step_given_up",
        reason=f"{why}; attempts sent: {st.attempt}",
    )


@dataclass
class _Due:
    """What a sweep finds due, step by step, in definition order."""

    running: bool
    saga_expired: bool
    backlog: Mapping[str, int] = field(default_factory=dict)
    waiting: list[Step] = field(default_factory=list)
    """Commands or compensations whose queue holds a backlog: they wait on."""
    resend: list[Step] = field(default_factory=list)
    """Forward commands with attempts left."""
    give_up: list[Step] = field(default_factory=list)
    """Forward commands whose attempts are spent, or in flight when the saga expired."""
    resend_compensation: list[Step] = field(default_factory=list)
    exhausted: list[Step] = field(default_factory=list)
    """Compensations whose attempts are spent."""
    fences: list[Step] = field(default_factory=list)

    @property
    def anything(self) -> bool:
        """Anything besides fences: those are chased on their own."""
        return bool(
            self.resend
            or self.give_up
            or self.resend_compensation
            or self.exhausted
            or self.saga_expired
        )

    @property
    def why(self) -> str:
        return "the saga's deadline passed" if self.saga_expired else "no answer after its attempts"

    def add(self, s: Step, st: StepState, now: datetime) -> None:
        step_due = st.deadline is not None and st.deadline <= now
        sent_at = st.requested_at or now
        patient = now - sent_at < BACKLOG_PATIENCE * s.timeout
        queued_behind = self.backlog.get(s.queue, 0) > 0 and patient
        if (
            step_due
            and queued_behind
            and not self.saga_expired
            and (st.status in (StepStatus.REQUESTED, StepStatus.COMPENSATING))
        ):
            self.waiting.append(s)
        elif st.status is StepStatus.REQUESTED and (step_due or self.saga_expired):
            attempts_left = st.attempt < s.retry.max_attempts
            if step_due and self.running and not self.saga_expired and attempts_left:
                self.resend.append(s)
            else:
                self.give_up.append(s)
        elif st.status is StepStatus.COMPENSATING and step_due:
            if st.compensation_attempt < s.compensation_retry.max_attempts:
                self.resend_compensation.append(s)
            else:
                self.exhausted.append(s)
        elif st.fencing and step_due:
            self.fences.append(s)


def _find_due(tx: Transition, backlog: Mapping[str, int]) -> _Due:
    running = tx.status is SagaStatus.RUNNING
    expired = running and tx.deadline is not None and tx.deadline <= tx.now
    due = _Due(running, expired, backlog)
    for s in tx.definition.steps:
        due.add(s, tx.steps[s.name], tx.now)
    return due


def _wait_behind_backlogs(tx: Transition, due: _Due) -> None:
    """Move each waiting step's deadline on by its timeout, saying why; nothing is sent."""
    for s in due.waiting:
        st = tx.steps[s.name]
        tx.changed = True
        tx.set_step(
            s.name,
            st.evolve(deadline=tx.now + s.timeout),
            "resend_deferred",
            reason=(
                f"no answer yet, and {s.queue} holds {due.backlog[s.queue]} messages waiting: "
                "the command is likely queued behind them; not sent again"
            ),
        )


def _chase_fences(tx: Transition, fences: list[Step]) -> bool:
    """Send again each fence with attempts left; the first without any puts the saga in
    MANUAL_REVIEW, and then nothing more is done (False)."""
    for s in fences:
        st = tx.steps[s.name]
        if st.compensation_attempt < s.compensation_retry.max_attempts:
            reason = f"attempt {st.compensation_attempt} had no answer"
            send(tx, s, st, Send.FENCE, reason=reason)
            continue
        tx.set_step(
            s.name,
            st.evolve(error="fence_failed", deadline=None, compensation_attempt=0),
            "fence_failed",
            reason=f"{st.compensation_attempt} attempts had no answer",
        )
        tx.manual_review(
            f"step {s.name!r} was done by hand and the fence of the command then in "
            "flight had no answer: its effect may be doubled"
        )
        return False
    return True


def _hand_to_a_person(tx: Transition, due: _Due) -> bool:
    """A step given up that cannot be undone, or a compensation whose attempts are spent:
    every step due is settled, and the saga goes to MANUAL_REVIEW (True)."""
    stuck = [s for s in due.give_up if not s.compensable]
    if not (stuck or due.exhausted):
        return False
    for s in due.give_up:
        give_up(tx, s, due.why)
    for s in due.exhausted:
        st = tx.steps[s.name]
        tx.set_step(
            s.name,
            st.evolve(status=StepStatus.COMPENSATION_FAILED, error="no_answer"),
            "compensation_exhausted",
            reason=f"{st.compensation_attempt} attempts had no answer",
        )
    if stuck:
        reason = (
            f"step {stuck[0].name!r} cannot be undone and its outcome is unknown ({due.why}); "
            "retry it to learn the outcome, or resolve by hand"
        )
    else:
        attempts = tx.steps[due.exhausted[0].name].compensation_attempt
        reason = (
            f"compensation of step {due.exhausted[0].name!r} had no answer after "
            f"{attempts} attempts"
        )
    tx.manual_review(reason)
    return True


def _send_again(tx: Transition, due: _Due) -> None:
    """Commands with attempts left are sent again, forward ones only while the saga goes
    forward; compensations whatever the saga does."""
    if due.give_up or due.saga_expired:
        _await_once_more(tx, due.resend)
    else:
        for s in due.resend:
            st = tx.steps[s.name]
            send(tx, s, st, Send.FORWARD, reason=f"attempt {st.attempt} had no answer in time")
    for s in due.resend_compensation:
        st = tx.steps[s.name]
        reason = f"attempt {st.compensation_attempt} had no answer in time"
        send(tx, s, st, Send.COMPENSATION, reason=reason)


def _give_up_spent(tx: Transition, due: _Due) -> None:
    """Forward commands whose attempts are spent are given up, and compensated at once
    by the ``compensate`` late-reply policy."""
    for s in due.give_up:
        give_up(tx, s, due.why)
        if s.late_reply is LateReplyPolicy.COMPENSATE:
            # Undo it in case it took effect; if it did not, the tombstone the
            # compensation leaves refuses the command should it still arrive.
            send(tx, s, tx.steps[s.name], Send.COMPENSATION)


def _await_once_more(tx: Transition, resend: list[Step]) -> None:
    """The saga turns to compensation: nothing more is sent forward, but what is in
    flight may still answer; it is awaited once more, then given up."""
    for s in resend:
        st = tx.steps[s.name]
        tx.set_step(
            s.name,
            st.evolve(deadline=tx.now + s.timeout),
            "step_awaited",
            reason="the saga turns to compensation: no re-send; its answer is awaited",
        )
