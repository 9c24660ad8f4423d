"""Deadlines (``DeadlinePassed``, from the sweeper): what a saga does about silence.

Silence is first explained where it can be, and then nothing is sent and no attempt is
spent (being slow under load is no reason to give up, and a copy would only double the
work of a backed-up queue):
- a command still waiting for capacity at its queue (flow control) has not been sent:
  its deadline moves on by as long as it has waited, at least the step's timeout
  (``dispatch_waiting``);
- a command sent later than it was decided waits from when it was sent: each attempt's
  deadline runs from dispatch (``deadline_from_dispatch``);
- a command whose queue holds a backlog is likely still queued behind it: its deadline
  moves on by the step's timeout (``resend_deferred``), for at most ``BACKLOG_PATIENCE``
  timeouts since it was sent.
Otherwise a step with no answer is sent again, same command id, each attempt waiting
longer than the one before (the retry policy's backoff and jitter), until its policy is
spent; then it is given up, its outcome unknown, and compensated at once or left
``TIMED_OUT`` by its late-reply policy while the saga compensates the rest.

Forward recovery: a step that cannot be undone is never given up for silence, nor is a
compensation: each is sent again, at most its policy's ``max_interval`` apart, until it
answers, with an alert (``step_overdue``, ``compensation_overdue``) once its policy's
attempts are spent. The saga's own deadline turns a RUNNING saga to compensation,
giving up what is in flight, unless a step that cannot be undone is in flight: then
undoing the rest could contradict what that step does, so the saga goes on forward
without a deadline (``deadline_passed_forward``). A fence with no answer after its
attempts puts the saga in MANUAL_REVIEW: an effect may be doubled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from saga_tasks.core.decider.commands import Send, current_wait, decide_by, send
from saga_tasks.core.decider.progress import (
    advance,
    after_pivot,
    begin_compensation,
    child_holding_an_effect,
    compensate_ready,
    forward_only,
    pivot_passed,
)
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import HumanTimeoutPolicy, LateReplyPolicy, Step
from saga_tasks.core.model import ESCALATED, FENCE_FAILED, NO_SIGNAL, SagaState, StepState
from saga_tasks.core.states import ACTIVE_SAGA, SagaStatus, StepStatus

BACKLOG_PATIENCE = 10
"""A command waits behind a backlog for at most this many of its step's timeouts since it
was last sent; then its silence is the participant's again (sent again, or given up), so
a queue that never drains (no consumer at all) still ends in a decision, and an alert."""


def on_deadline(
    tx: Transition,
    backlog: Mapping[str, int] | None = None,
    dispatch: Mapping[str, datetime | None] | None = None,
) -> None:
    """Act on every deadline that has passed; a sweep that finds none changes nothing.
    ``backlog``: messages waiting in each command queue, as the sweeper saw them;
    ``dispatch``: when each step's latest command under flow control was sent (None:
    it still waits for capacity)."""
    if tx.status not in ACTIVE_SAGA:
        return
    _go_forward_past_deadline(tx)
    # What calls a person comes first, before anything is sent: a decision that ends in
    # review (or turns to compensation) sends nothing forward with it. Several deadlines
    # fall due in one sweep whenever the sweeper is late or an answer is.
    _human_deadlines(tx)
    if tx.status not in ACTIVE_SAGA:
        return
    due = _find_due(tx, backlog or {}, dispatch or {})
    if not _chase_fences(tx, due.fences):
        return
    _retry_failed(tx)
    _explain_silence(tx, due)
    if not due.anything:
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
    forward_only: frozenset[str] = frozenset()
    """Steps never given up: they cannot be undone, or follow the pivot that succeeded."""
    backlog: Mapping[str, int] = field(default_factory=dict)
    dispatch: Mapping[str, datetime | None] = field(default_factory=dict)
    for_capacity: list[Step] = field(default_factory=list)
    """Commands or compensations still waiting for capacity at their queue."""
    from_dispatch: list[tuple[Step, datetime]] = field(default_factory=list)
    """Commands or compensations sent later than decided: their deadline from dispatch."""
    waiting: list[Step] = field(default_factory=list)
    """Commands or compensations whose queue holds a backlog: they wait on."""
    resend: list[Step] = field(default_factory=list)
    """Forward commands with attempts left."""
    forward: list[Step] = field(default_factory=list)
    """Forward commands of steps that cannot be undone: sent until they answer."""
    give_up: list[Step] = field(default_factory=list)
    """Forward commands whose attempts are spent, or in flight when the saga expired."""
    resend_compensation: list[Step] = field(default_factory=list)
    fences: list[Step] = field(default_factory=list)

    @property
    def anything(self) -> bool:
        """Anything besides fences and explained silence: those are handled on their own."""
        return bool(
            self.resend
            or self.forward
            or self.give_up
            or self.resend_compensation
            or self.saga_expired
        )

    @property
    def why(self) -> str:
        return "the saga's deadline passed" if self.saga_expired else "no answer after its attempts"

    def add(self, saga: SagaState, s: Step, st: StepState, now: datetime) -> None:
        if s.human is not None:
            return  # no command: ``_human_deadlines``, and compensation withdraws the wait
        step_due = st.deadline is not None and st.deadline <= now
        awaited = st.status in (StepStatus.REQUESTED, StepStatus.COMPENSATING) or st.fencing
        if step_due and awaited and not self.saga_expired and self._explained(saga, s, st, now):
            return
        if st.status is StepStatus.REQUESTED and (step_due or self.saga_expired):
            attempts_left = st.attempt < s.retry.max_attempts
            if s.name in self.forward_only:
                if step_due:
                    self.forward.append(s)
            elif step_due and self.running and not self.saga_expired and attempts_left:
                self.resend.append(s)
            else:
                self.give_up.append(s)
        elif st.status is StepStatus.COMPENSATING and step_due:
            self.resend_compensation.append(s)
        elif st.fencing and step_due:
            self.fences.append(s)

    def _explained(self, saga: SagaState, s: Step, st: StepState, now: datetime) -> bool:
        """A silence flow control or a backlog explains: the step waits on (True)."""
        sent_at = st.requested_at or now
        if s.name in self.dispatch:
            dispatched = self.dispatch[s.name]
            if dispatched is None:
                self.for_capacity.append(s)
                return True
            until = dispatched + current_wait(saga, s, st)
            if until > now:
                self.from_dispatch.append((s, until))
                return True
            sent_at = dispatched
        if self.backlog.get(s.queue, 0) > 0 and now - sent_at < BACKLOG_PATIENCE * s.timeout:
            self.waiting.append(s)
            return True
        return False


def _find_due(
    tx: Transition, backlog: Mapping[str, int], dispatch: Mapping[str, datetime | None]
) -> _Due:
    running = tx.status is SagaStatus.RUNNING
    expired = running and tx.deadline is not None and tx.deadline <= tx.now
    forward = frozenset(s.name for s in tx.definition.steps if forward_only(tx, s))
    due = _Due(running, expired, forward, backlog, dispatch)
    for s in tx.definition.steps:
        due.add(tx.before, s, tx.steps[s.name], tx.now)
    return due


def _go_forward_past_deadline(tx: Transition) -> None:
    """The saga's deadline passed while a step that cannot be undone is in flight: its
    outcome decides, so the saga goes on without a deadline rather than compensating."""
    if tx.status is not SagaStatus.RUNNING or tx.deadline is None or tx.deadline > tx.now:
        return
    pivot = tx.definition.pivot
    if pivot is not None and pivot_passed(tx):
        step, reason = (
            pivot,
            (
                f"the saga's deadline passed after its pivot {pivot!r} succeeded: nothing is "
                "undone after the pivot, so the saga goes on forward without a deadline"
            ),
        )
    else:
        pivots = [
            s.name
            for s in tx.definition.steps
            if not s.compensable
            and s.human is None
            and tx.steps[s.name].status is StepStatus.REQUESTED
        ]
        if not pivots:
            return
        step, reason = (
            pivots[0],
            (
                f"the saga's deadline passed while step {pivots[0]!r}, which cannot be undone, "
                "was in flight: undoing the rest could contradict it, so the saga goes on "
                "forward without a deadline, and the step is sent again until it answers"
            ),
        )
    tx.changed = True
    tx.deadline = None
    tx.note("deadline_passed_forward", step=step, reason=reason)


def _retry_failed(tx: Transition) -> None:
    """A step that failed after the pivot is sent again, as a new command, once its
    wait is over."""
    if tx.status is not SagaStatus.RUNNING:
        return
    for s in tx.definition.steps:
        st = tx.steps[s.name]
        if not st.awaits_retry or st.deadline is None or st.deadline > tx.now:
            continue
        again = st.evolve(
            generation=st.generation + 1,  # below MAX_GENERATIONS: the failure checked it
            command_id=None,
            compensation_id=None,
            compensation_attempt=0,
            error=None,
            deadline=None,
            result=None,
        )
        send(tx, s, again, Send.FORWARD, reason=f"failed after the pivot ({st.error})")


def _human_deadlines(tx: Transition) -> None:
    """A decision still missing at the escalation raises the alert; at the deadline the
    step's policy decides: it fails (and the saga compensates), or a person reviews."""
    for s in tx.definition.steps:
        st = tx.steps[s.name]
        if s.human is None or st.status is not StepStatus.REQUESTED:
            continue
        if st.deadline is None or st.deadline > tx.now:
            continue
        final = decide_by(s, st)
        if st.error != ESCALATED and tx.now < final:
            tx.set_step(
                s.name,
                st.evolve(error=ESCALATED, deadline=final),
                "signal_escalated",
                reason=f"no decision yet; due by {final.isoformat()}",
            )
            continue
        why = f"no decision by its deadline ({final.isoformat()})"
        if s.human.on_timeout is HumanTimeoutPolicy.COMPENSATE and not after_pivot(tx, s):
            tx.set_step(
                s.name,
                st.evolve(status=StepStatus.FAILED, error=NO_SIGNAL, deadline=None),
                "step_failed",
                reason=why,
            )
            advance(tx, trigger=f"human step {s.name!r} had {why}")
            return
        tx.set_step(
            s.name,
            st.evolve(status=StepStatus.TIMED_OUT, given_up=True, error=NO_SIGNAL, deadline=None),
            "step_given_up",
            reason=why,
        )
        tx.manual_review(
            f"human step {s.name!r} had {why}: retry it to wait again, skip it, or resolve"
        )
        return


def _explain_silence(tx: Transition, due: _Due) -> None:
    """Move the deadline of each step whose silence is explained, saying why; nothing
    is sent and no attempt is spent."""
    for s in due.for_capacity:
        st = tx.steps[s.name]
        # As long again as it has waited (at least a timeout): a long wait is looked at
        # a few times, not once a timeout. Once sent, the next look moves the deadline
        # to dispatch plus the attempt's wait (``deadline_from_dispatch``).
        waited = tx.now - (st.requested_at or tx.now)
        tx.set_step(
            s.name,
            st.evolve(deadline=tx.now + max(s.timeout, waited)),
            "dispatch_waiting",
            reason=(
                f"its command still waits for capacity at {s.queue} (flow control); "
                "the step's deadline runs from when it is sent"
            ),
        )
    for s, until in due.from_dispatch:
        st = tx.steps[s.name]
        tx.set_step(
            s.name,
            st.evolve(deadline=until),
            "deadline_from_dispatch",
            reason=(
                f"its command waited for capacity at {s.queue}; the deadline runs from "
                f"when it was sent: {until.isoformat()}"
            ),
        )
    for s in due.waiting:
        st = tx.steps[s.name]
        tx.set_step(
            s.name,
            st.evolve(deadline=tx.now + s.timeout),
            "resend_deferred",
            reason=(
                f"no answer yet, and {due.backlog[s.queue]} messages wait in {s.queue} or for "
                "the orchestrator: the command or its answer is likely queued behind them; "
                "not sent again"
            ),
        )


def _chase_fences(tx: Transition, fences: list[Step]) -> bool:
    """The first fence whose attempts are spent puts the saga in MANUAL_REVIEW, and then
    nothing is sent (False); otherwise each is sent again."""
    for s in fences:
        st = tx.steps[s.name]
        if st.compensation_attempt < s.compensation_retry.max_attempts:
            continue
        tx.set_step(
            s.name,
            st.evolve(error=FENCE_FAILED, deadline=None, compensation_attempt=0),
            "fence_failed",
            reason=f"{st.compensation_attempt} attempts had no answer",
        )
        tx.manual_review(
            f"step {s.name!r} was done by hand and the fence of the command then in "
            "flight had no answer: its effect may be doubled"
        )
        return False
    for s in fences:
        st = tx.steps[s.name]
        send(tx, s, st, Send.FENCE, reason=f"attempt {st.compensation_attempt} had no answer")
    return True


def _send_again(tx: Transition, due: _Due) -> None:
    """Commands with attempts left are sent again, forward ones only while the saga goes
    forward; a step that cannot be undone, and a compensation, whatever the saga does
    and however many attempts it took (with an alert once its policy is spent)."""
    if due.give_up or due.saga_expired:
        _await_once_more(tx, due.resend)
    else:
        for s in due.resend:
            st = tx.steps[s.name]
            send(tx, s, st, Send.FORWARD, reason=f"attempt {st.attempt} had no answer in time")
    for s in due.forward:
        st = tx.steps[s.name]
        send(tx, s, st, Send.FORWARD, reason=f"attempt {st.attempt} had no answer in time")
        _alert_once_spent(tx, s, "step_overdue", (st.attempt, s.retry.max_attempts),
                          "the step cannot be undone, so it is")  # fmt: skip
    for s in due.resend_compensation:
        st = tx.steps[s.name]
        child = child_holding_an_effect(tx, s.name)
        if child is not None:
            # Sent before a step depending on it was to be undone too (a person's
            # ``compensate`` of a step given up): children first, the copy waits.
            tx.set_step(
                s.name,
                st.evolve(deadline=tx.now + current_wait(tx.before, s, st)),
                "compensation_deferred",
                reason=f"step {child!r}, which depends on it, is to be undone first",
            )
            continue
        reason = f"attempt {st.compensation_attempt} had no answer in time"
        send(tx, s, st, Send.COMPENSATION, reason=reason)
        _alert_once_spent(tx, s, "compensation_overdue",
                          (st.compensation_attempt, s.compensation_retry.max_attempts),
                          "a compensation is")  # fmt: skip


def _alert_once_spent(
    tx: Transition, s: Step, event: str, sent_of: tuple[int, int], what: str
) -> None:
    """The one alert of forward recovery: when the attempts sent (of the policy's) are
    all spent."""
    attempts, policy = sent_of
    if attempts == policy:
        tx.note(
            event,
            step=s.name,
            reason=(
                f"no answer after {attempts} attempts; {what} sent again until it answers: "
                "look at its participant"
            ),
        )


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
