"""The pure decider: ``decide(definition, state, event, now) -> Decision``.

All saga logic lives here and nowhere else. It reads no clock, touches no database
and sends nothing: it returns the new state, the commands to send, and the history
entries that explain the change. Every way an event can be classified (accepted,
duplicate, late, conflicting, invalid) is an explicit branch with a history entry.

Rules, in short:
- steps whose parents have all succeeded are sent together (fan-out); a step waits
  for all of its parents (fan-in);
- a failed step turns the saga to COMPENSATING: steps never sent are skipped, every
  succeeded step is undone, children before parents, and a step still in flight is
  undone once it answers;
- a step without a compensation stays done (COMPENSATION_SKIPPED);
- a refused compensation, or an answer that contradicts an earlier one, puts the
  saga in MANUAL_REVIEW with the reason; only an operator takes it out.

Time (``DeadlinePassed``, from the sweeper):
- a step with no answer by its deadline is sent again, same command id, until its
  retry policy is spent; then it is given up, its outcome unknown. By its late-reply
  policy it is compensated at once (``compensate``: the compensation either undoes a
  late effect or leaves a tombstone that refuses the command) or left ``TIMED_OUT``
  (``ignore``, ``manual_review``); the saga compensates the rest. A step that cannot be
  undone and gives no answer puts the saga in MANUAL_REVIEW: nothing safe remains.
- a compensation with no answer is sent again until its policy is spent; then the
  saga goes to MANUAL_REVIEW;
- the saga's own deadline turns a RUNNING saga to compensation, giving up what is
  in flight.
A reply to a step that was given up is late: it is written down, and with the
``manual_review`` policy a late success puts the saga in MANUAL_REVIEW.

Dead letters (``DeadLettered``, from the intake): a step's command in the dead-letter
queue gives the step up by its ``on_dead_letter`` policy (compensate, or manual
review); a dead compensation or a dead reply needs a person.

Operators (``OperatorAction``): retry a step or its compensation, skip a step (done
or undone by hand), compensate, or resolve a saga in MANUAL_REVIEW to a final status.
An action the saga's state does not allow raises ``ActionRefused`` with the reason;
nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from saga_tasks.core.definitions import DeadLetterPolicy, LateReplyPolicy, SagaDefinition, Step
from saga_tasks.core.events import (
    DeadLettered,
    DeadlinePassed,
    Event,
    OperatorAction,
    OperatorVerb,
    ReplyReceived,
    Started,
)
from saga_tasks.core.messages import MAX_GENERATIONS
from saga_tasks.core.model import (
    FENCING,
    LATE_FAILURE,
    LATE_SUCCESS,
    SagaState,
    StepState,
    command_id,
    message_id,
)
from saga_tasks.core.states import (
    ACTIVE_SAGA,
    FORWARD_SUCCEEDED,
    TERMINAL_SAGA,
    Classification,
    MessageKind,
    Outcome,
    SagaStatus,
    StepStatus,
)
from saga_tasks.errors import ActionRefused

__all__ = ["CommandIntent", "Decision", "HistoryEntry", "decide", "hand_over", "replay_awaits"]


@dataclass(frozen=True)
class CommandIntent:
    """A command or compensation to send once the decision is committed."""

    saga_id: str
    step: str
    kind: MessageKind
    task_name: str
    queue: str
    command_id: str
    message_id: str
    attempt: int
    body: Mapping[str, Any]
    compensates: str | None = None
    """For a compensation: the id of the forward command it undoes."""
    supersedes: tuple[str, ...] = ()
    """For a compensation: the ids earlier generations of it had. The participant fences
    them (a tombstone) and, if one of them already undid the command, runs nothing."""


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a saga's history: what happened and why."""

    event: str
    saga_status_before: SagaStatus | None
    saga_status_after: SagaStatus
    step: str | None = None
    step_status_before: StepStatus | None = None
    step_status_after: StepStatus | None = None
    message_id: str | None = None
    reason: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What ``decide`` returns; ``changed`` is False when only history is written."""

    state: SagaState
    commands: tuple[CommandIntent, ...]
    history: tuple[HistoryEntry, ...]
    classification: Classification
    changed: bool


def decide(definition: SagaDefinition, state: SagaState, event: Event, now: datetime) -> Decision:
    """Apply one event to one saga."""
    if state.saga_type != definition.saga_type or state.definition_version != definition.version:
        raise ValueError(
            f"definition {definition.saga_type} v{definition.version} does not match saga "
            f"{state.saga_id} ({state.saga_type} v{state.definition_version})"
        )
    tx = _Transition(definition, state, now)
    if isinstance(event, Started):
        tx.on_started()
    elif isinstance(event, ReplyReceived):
        tx.on_reply(event)
    elif isinstance(event, DeadlinePassed):
        tx.on_deadline()
    elif isinstance(event, DeadLettered):
        tx.on_dead_letter(event)
    elif isinstance(event, OperatorAction):
        tx.on_operator(event)
    else:  # pragma: no cover - the Event union is closed
        raise TypeError(f"unknown event {event!r}")
    return tx.decision()


def hand_over(state: SagaState, reason: str) -> Decision:
    """A saga the shell could not decide (its definition is not loaded, the decider
    failed, or it found nothing to do at a deadline that passed) goes to a person with
    the reason, so it is never picked up again and again."""
    after = replace(
        state, status=SagaStatus.MANUAL_REVIEW, reason=reason, version=state.version + 1
    )
    entry = HistoryEntry(
        event="manual_review",
        saga_status_before=state.status,
        saga_status_after=SagaStatus.MANUAL_REVIEW,
        reason=reason,
    )
    return Decision(after, (), (entry,), Classification.ACCEPTED, changed=True)


def replay_awaits(
    state: SagaState, step: str | None, kind: MessageKind | None, cid: str | None
) -> str | None:
    """What a held message of ``state`` is to the saga if published again: ``"in flight"``
    (its step awaits it now), ``"a dead compensation"``, ``"a given-up command"`` or ``"a
    fence"`` (awaited again once replayed), or None (the step has moved on). The replay
    checks and the decider's replay both ask this, so they cannot disagree."""
    st = state.steps.get(step or "")
    if st is None or state.status in TERMINAL_SAGA or kind is None:
        return None
    if kind is MessageKind.COMMAND and cid in (None, st.command_id):
        if st.status is StepStatus.REQUESTED:
            return "in flight"
        compensation_begun = any(
            x.status not in (StepStatus.PENDING, StepStatus.REQUESTED, StepStatus.SUCCEEDED,
                             StepStatus.TIMED_OUT, StepStatus.FAILED)
            for x in state.steps.values()
        )  # fmt: skip
        if (
            st.status is StepStatus.TIMED_OUT
            and st.error not in (LATE_SUCCESS, LATE_FAILURE)
            and state.status in (SagaStatus.RUNNING, SagaStatus.MANUAL_REVIEW)
            and not compensation_begun
        ):
            return "a given-up command"
    if kind is MessageKind.COMPENSATION:
        if cid in (None, st.compensation_id):
            if st.status is StepStatus.COMPENSATING:
                return "in flight"
            if st.status is StepStatus.COMPENSATION_FAILED and st.error == "dead_lettered":
                return "a dead compensation"
        fence_id = command_id(
            state.saga_id, step or "", MessageKind.COMPENSATION, st.generation - 1
        )
        if cid == fence_id and st.status is StepStatus.SUCCEEDED:
            if st.fencing:
                return "in flight"
            if st.error == "fence_failed":
                return "a fence"
    return None


class _Transition:
    """The mutable scratch space of one decision; ``decision()`` freezes it."""

    def __init__(self, definition: SagaDefinition, state: SagaState, now: datetime) -> None:
        self.definition = definition
        self.before = state
        self.now = now
        self.status = state.status
        self.reason = state.reason
        self.deadline = state.deadline
        self.finished_at = state.finished_at
        self.steps: dict[str, StepState] = dict(state.steps)
        self.commands: list[CommandIntent] = []
        self.history: list[HistoryEntry] = []
        self.classification = Classification.ACCEPTED
        self.changed = False

    # -- events ---------------------------------------------------------------------------

    def on_started(self) -> None:
        if self.before.version != 0:
            self.classification = Classification.DUPLICATE
            self.note("duplicate_start", reason="the saga was already started")
            return
        self.changed = True
        self.deadline = self.now + self.definition.timeout
        self.note("saga_started", detail={"deadline": self.deadline.isoformat()})
        self.dispatch_ready()

    def on_reply(self, event: ReplyReceived) -> None:
        if event.step not in self.definition.by_name:
            self.invalid(event, f"reply names unknown step {event.step!r}")
        elif event.kind is MessageKind.COMMAND:
            self.on_action_reply(event)
        elif event.kind is MessageKind.COMPENSATION:
            self.on_compensation_reply(event)
        else:
            self.invalid(event, f"a {event.kind.value} message is not a reply")

    def on_action_reply(self, event: ReplyReceived) -> None:
        name = event.step
        st = self.steps[name]
        if st.command_id is None or event.command_id != st.command_id:
            if self.superseded(name, MessageKind.COMMAND, event.command_id, st) is not None:
                self.classification = Classification.LATE
                self.note(
                    "late_reply",
                    step=name,
                    message_id=event.message_id,
                    reason=f"reply {event.outcome.value} to a command an operator retry superseded",
                )
                return
            self.invalid(
                event, f"reply to command {event.command_id} which step {name!r} did not send"
            )
            return
        success = event.outcome is Outcome.SUCCESS
        if "skipped_by" in (st.result or {}):
            self.classification = Classification.LATE
            self.note(
                "late_reply",
                step=name,
                message_id=event.message_id,
                reason=f"late {event.outcome.value}: the step was done by hand; its fence "
                "undoes the command or refuses it",
            )
            return
        if st.status is StepStatus.REQUESTED:
            self.changed = True
            if success:
                self.set_step(
                    name,
                    st.evolve(
                        status=StepStatus.SUCCEEDED, finished_at=self.now, result=event.result or {}
                    ),
                    "step_succeeded",
                    message_id=event.message_id,
                )
            else:
                code = event.error_code or "failed"
                self.set_step(
                    name,
                    st.evolve(status=StepStatus.FAILED, finished_at=self.now, error=code),
                    "step_failed",
                    message_id=event.message_id,
                    reason=_error_text(event),
                )
            self.advance(trigger=f"step {name!r} failed: {_error_text(event)}")
            return
        if st.given_up:
            self.late_reply(event, st)
            return
        if (success and st.status in FORWARD_SUCCEEDED) or (
            not success and st.status is StepStatus.FAILED
        ):
            self.classification = Classification.DUPLICATE
            self.note(
                "duplicate_reply",
                step=name,
                message_id=event.message_id,
                reason=f"step {name!r} already answered {event.outcome.value}",
            )
            return
        said = "success" if st.status in FORWARD_SUCCEEDED else "failure"
        self.conflict(event, f"step {name!r} answered {said}, now {event.outcome.value}")

    def on_compensation_reply(self, event: ReplyReceived) -> None:
        name = event.step
        st = self.steps[name]
        success = event.outcome is Outcome.SUCCESS
        if st.compensation_id is None or event.command_id != st.compensation_id:
            generation = self.superseded(name, MessageKind.COMPENSATION, event.command_id, st)
            if generation is None:
                self.invalid(
                    event,
                    f"reply to compensation {event.command_id} which step {name!r} did not send",
                )
            elif (
                generation == st.generation - 1
                and st.status is StepStatus.SUCCEEDED
                and (st.fencing or (success and st.error == "fence_failed"))
            ):
                self.fence_answered(event, st)
            elif success and st.status in (
                StepStatus.COMPENSATING,
                StepStatus.COMPENSATION_FAILED,
            ):
                # An earlier generation undid the step after all; the newer one, when it
                # arrives, finds that and runs nothing.
                self.compensation_done(
                    event, st, "an earlier generation of the compensation undid the step"
                )
            else:
                self.classification = Classification.LATE
                self.note(
                    "late_reply",
                    step=name,
                    message_id=event.message_id,
                    reason=f"compensation reply {event.outcome.value} to an id an operator "
                    "retry superseded",
                )
            return
        if st.status is StepStatus.COMPENSATING or (
            success
            and st.status is StepStatus.COMPENSATION_FAILED
            and st.error in _UNANSWERED_COMPENSATION
        ):
            self.changed = True
            if success and st.status is StepStatus.COMPENSATION_FAILED:
                # Given up for silence or a dead letter, and then answered: late, and
                # the step is undone all the same.
                self.classification = Classification.LATE
                self.compensation_done(event, st, "its late answer: the step is undone")
            elif success:
                self.compensation_done(event, st, None)
            else:
                self.set_step(
                    name,
                    st.evolve(status=StepStatus.COMPENSATION_FAILED, error=event.error_code),
                    "compensation_failed",
                    message_id=event.message_id,
                    reason=_error_text(event),
                )
                self.manual_review(
                    f"compensation of step {name!r} was refused: {_error_text(event)}"
                )
            return
        if not success and st.status is StepStatus.COMPENSATED:
            self.classification = Classification.LATE
            self.note(
                "late_reply",
                step=name,
                message_id=event.message_id,
                reason=f"compensation of {name!r} refused ({_error_text(event)}), but an "
                "earlier generation already undid the step",
            )
            return
        if (success and st.status is StepStatus.COMPENSATED) or (
            not success and st.status is StepStatus.COMPENSATION_FAILED
        ):
            self.classification = Classification.DUPLICATE
            self.note(
                "duplicate_reply",
                step=name,
                message_id=event.message_id,
                reason=f"compensation of {name!r} already answered {event.outcome.value}",
            )
            return
        self.conflict(
            event,
            f"compensation of step {name!r} answered {event.outcome.value} "
            f"while the step is {st.status.value}",
        )

    def late_reply(self, event: ReplyReceived, st: StepState) -> None:
        """A reply to a step that was given up; every one is written down."""
        name = event.step
        step = self.definition.step(name)
        self.classification = Classification.LATE
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
            self.set_step(
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
            self.note("late_reply", step=name, message_id=event.message_id, reason=what)
        if (
            event.outcome is Outcome.SUCCESS
            and st.status is StepStatus.TIMED_OUT
            and (step.late_reply is LateReplyPolicy.MANUAL_REVIEW or not step.compensable)
            and self.status is not SagaStatus.MANUAL_REVIEW
        ):
            self.manual_review(f"step {name!r} succeeded after it was given up")

    def superseded(self, name: str, kind: MessageKind, cid: str, st: StepState) -> int | None:
        """The earlier generation whose id ``cid`` is, or None when it is no id of ours."""
        for generation in range(1, st.generation):
            if cid == command_id(self.before.saga_id, name, kind, generation):
                return generation
        return None

    def compensation_done(self, event: ReplyReceived, st: StepState, by: str | None) -> None:
        """The step is undone: settle it, and go on compensating (or out of review)."""
        name = event.step
        self.set_step(
            name,
            st.evolve(status=StepStatus.COMPENSATED, finished_at=self.now, error=None),
            "step_compensated",
            message_id=event.message_id,
            reason=by,
        )
        # In review the saga stays there (only a person takes it out); the step is
        # settled, so ``compensate`` or ``resolve`` finds it undone.
        self.advance(trigger="")

    def fence_answered(self, event: ReplyReceived, st: StepState) -> None:
        """The compensation sent to fence a command in flight when the step was done by hand."""
        name = event.step
        if event.outcome is Outcome.SUCCESS:
            if st.error == "fence_failed":
                self.classification = Classification.LATE  # given up, then answered
            self.set_step(
                name,
                st.evolve(error=None, deadline=None, compensation_attempt=0),
                "fence_confirmed",
                message_id=event.message_id,
                reason="the command in flight when the step was done by hand is fenced: "
                + str((event.result or {}).get("nothing_to_undo") or "its effect was undone"),
            )
            self.advance(trigger="")
            return
        self.set_step(
            name,
            st.evolve(error="fence_failed", deadline=None, compensation_attempt=0),
            "fence_failed",
            message_id=event.message_id,
            reason=_error_text(event),
        )
        self.manual_review(
            f"step {name!r} was done by hand and the command then in flight could not be "
            f"fenced ({_error_text(event)}): its effect may be doubled"
        )

    def on_deadline(self) -> None:
        """Act on every deadline that has passed; a sweep that finds none changes nothing."""
        if self.status not in ACTIVE_SAGA:
            return
        running = self.status is SagaStatus.RUNNING
        saga_expired = running and self.deadline is not None and self.deadline <= self.now
        resend: list[Step] = []
        give_up: list[Step] = []
        resend_compensation: list[Step] = []
        exhausted: list[Step] = []
        fences: list[Step] = []
        for s in self.definition.steps:
            st = self.steps[s.name]
            due = st.deadline is not None and st.deadline <= self.now
            if st.status is StepStatus.REQUESTED and (due or saga_expired):
                if due and running and not saga_expired and st.attempt < s.retry.max_attempts:
                    resend.append(s)
                else:
                    give_up.append(s)
            elif st.status is StepStatus.COMPENSATING and due:
                if st.compensation_attempt < s.compensation_retry.max_attempts:
                    resend_compensation.append(s)
                else:
                    exhausted.append(s)
            elif st.fencing and due:
                fences.append(s)
        for s in fences:
            st = self.steps[s.name]
            if st.compensation_attempt < s.compensation_retry.max_attempts:
                self.send_fence(s, st, reason=f"attempt {st.compensation_attempt} had no answer")
            else:
                self.set_step(
                    s.name,
                    st.evolve(error="fence_failed", deadline=None, compensation_attempt=0),
                    "fence_failed",
                    reason=f"{st.compensation_attempt} attempts had no answer",
                )
                self.manual_review(
                    f"step {s.name!r} was done by hand and the fence of the command then in "
                    "flight had no answer: its effect may be doubled"
                )
                return
        if not (resend or give_up or resend_compensation or exhausted or saga_expired):
            return
        why = "the saga's deadline passed" if saga_expired else "no answer after its attempts"
        # What needs a person is settled first, and then nothing at all is sent.
        stuck = [s for s in give_up if not s.compensable]
        if stuck or exhausted:
            for s in give_up:
                self.mark_given_up(s, why)
            for s in exhausted:
                st = self.steps[s.name]
                self.set_step(
                    s.name,
                    st.evolve(status=StepStatus.COMPENSATION_FAILED, error="no_answer"),
                    "compensation_exhausted",
                    reason=f"{st.compensation_attempt} attempts had no answer",
                )
            if stuck:
                reason = (
                    f"step {stuck[0].name!r} cannot be undone and its outcome is unknown ({why})"
                )
            else:
                attempts = self.steps[exhausted[0].name].compensation_attempt
                reason = (
                    f"compensation of step {exhausted[0].name!r} had no answer after "
                    f"{attempts} attempts"
                )
            self.manual_review(reason)
            return
        if give_up or saga_expired:
            # The saga turns to compensation: nothing more is sent forward, but what is in
            # flight may still answer; it is awaited once more, then given up.
            for s in resend:
                st = self.steps[s.name]
                self.set_step(
                    s.name,
                    st.evolve(deadline=self.now + s.timeout),
                    "step_awaited",
                    reason="the saga turns to compensation: no re-send; its answer is awaited",
                )
            resend = []
        for s in resend:
            st = self.steps[s.name]
            self.send_action(s, st, reason=f"attempt {st.attempt} had no answer in time")
        for s in resend_compensation:
            st = self.steps[s.name]
            self.send_compensation(
                s, st, reason=f"attempt {st.compensation_attempt} had no answer in time"
            )
        for s in give_up:
            self.mark_given_up(s, why)
            if s.late_reply is LateReplyPolicy.COMPENSATE:
                # Undo it in case it took effect; if it did not, the tombstone the
                # compensation leaves refuses the command should it still arrive.
                self.send_compensation(s, self.steps[s.name])
        if running and (saga_expired or give_up):
            first = give_up[0].name if give_up else None
            reason = why if saga_expired or first is None else f"step {first!r} had {why}"
            self.begin_compensation(reason)
        elif self.status is SagaStatus.COMPENSATING:
            self.compensate_ready()

    def mark_given_up(self, s: Step, why: str) -> None:
        st = self.steps[s.name]
        self.set_step(
            s.name,
            st.evolve(status=StepStatus.TIMED_OUT, given_up=True, error="timed_out"),
            "step_given_up",
            reason=f"{why}; attempts sent: {st.attempt}",
        )

    # -- dead letters -----------------------------------------------------------------------

    def on_dead_letter(self, e: DeadLettered) -> None:
        reason = f"{e.kind.value} dead-lettered: {e.reason}"
        detail = {"held_id": e.held_id}
        step = self.definition.by_name.get(e.step or "")
        active = self.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING)
        if step is None or not active:
            self.classification = Classification.LATE
            why = "its saga is not active" if step is not None else "it names no step of this saga"
            self.note("dead_letter_recorded", step=e.step if step else None,
                      message_id=e.message_id, reason=f"{reason}; nothing to do: {why}",
                      detail=detail)  # fmt: skip
            return
        st = self.steps[step.name]
        if (
            e.kind is MessageKind.COMMAND
            and st.status is StepStatus.REQUESTED
            and (e.command_id == st.command_id)
        ):
            self.note("dead_lettered", step=step.name, message_id=e.message_id, reason=reason,
                      detail=detail)  # fmt: skip
            self.changed = True
            if step.on_dead_letter is DeadLetterPolicy.MANUAL_REVIEW:
                # The step still awaits its answer: replaying the message resumes the saga.
                self.manual_review(f"step {step.name!r}: {reason}")
                return
            self.mark_given_up(step, "its command was dead-lettered")
            if not step.compensable:
                self.manual_review(f"step {step.name!r}: {reason}; it cannot be undone")
                return
            self.send_compensation(step, self.steps[step.name])
            if self.status is SagaStatus.RUNNING:
                self.begin_compensation(f"step {step.name!r}: {reason}")
            else:
                self.compensate_ready()
            return
        if (
            e.kind is MessageKind.COMPENSATION
            and st.status is StepStatus.COMPENSATING
            and (e.command_id == st.compensation_id)
        ):
            self.note("dead_lettered", step=step.name, message_id=e.message_id, reason=reason,
                      detail=detail)  # fmt: skip
            self.set_step(
                step.name,
                st.evolve(status=StepStatus.COMPENSATION_FAILED, error="dead_lettered"),
                "compensation_failed",
                reason=reason,
            )
            self.manual_review(f"compensation of step {step.name!r}: {reason}")
            return
        fence_id = command_id(
            self.before.saga_id, step.name, MessageKind.COMPENSATION, st.generation - 1
        )
        if e.kind is MessageKind.COMPENSATION and st.fencing and e.command_id == fence_id:
            self.note("dead_lettered", step=step.name, message_id=e.message_id, reason=reason,
                      detail=detail)  # fmt: skip
            self.set_step(
                step.name,
                st.evolve(error="fence_failed", deadline=None, compensation_attempt=0),
                "fence_failed",
                reason=reason,
            )
            self.manual_review(
                f"step {step.name!r} was done by hand and the fence of the command then in "
                f"flight was dead-lettered ({e.reason}): replay it, or undo the command by hand"
            )
            return
        if e.kind is MessageKind.REPLY:
            self.note("dead_lettered", step=step.name, message_id=e.message_id, reason=reason,
                      detail=detail)  # fmt: skip
            self.manual_review(f"a reply of step {step.name!r} could not be applied: {e.reason}")
            return
        self.classification = Classification.LATE
        self.note(
            "dead_letter_recorded",
            step=step.name,
            message_id=e.message_id,
            reason=f"{reason}; the step has moved on ({st.status.value})",
            detail=detail,
        )

    # -- operators --------------------------------------------------------------------------

    def on_operator(self, a: OperatorAction) -> None:
        if not a.actor.strip() or not a.reason.strip():
            raise ActionRefused("an operator action needs an actor and a reason")
        handlers = {
            OperatorVerb.RETRY_STEP: self.operator_retry_step,
            OperatorVerb.SKIP_STEP: self.operator_skip_step,
            OperatorVerb.COMPENSATE: self.operator_compensate,
            OperatorVerb.RESOLVE: self.operator_resolve,
            OperatorVerb.REPLAY: self.operator_replay,
        }
        handlers[a.verb](a)

    def _operator_step(self, a: OperatorAction) -> tuple[Step, StepState]:
        if not a.step or a.step not in self.definition.by_name:
            known = ", ".join(self.definition.by_name)
            raise ActionRefused(f"unknown step {a.step!r}; steps: {known}")
        return self.definition.step(a.step), self.steps[a.step]

    def _compensation_begun(self) -> bool:
        return any(
            st.status
            in (
                StepStatus.COMPENSATING,
                StepStatus.COMPENSATED,
                StepStatus.COMPENSATION_FAILED,
                StepStatus.COMPENSATION_SKIPPED,
                StepStatus.SKIPPED,
            )
            for st in self.steps.values()
        )

    def _refuse_if_final(self, verb: str) -> None:
        if self.status in TERMINAL_SAGA:
            raise ActionRefused(f"cannot {verb}: the saga is {self.status.value}")

    def operator_retry_step(self, a: OperatorAction) -> None:
        self._refuse_if_final("retry a step")
        s, st = self._operator_step(a)
        said = f"operator {a.actor}: {a.reason}"
        if st.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED):
            self.note("operator_retry_step", step=s.name, reason=said)
            self.set_status(SagaStatus.COMPENSATING, self.reason)
            # A new generation: the participant runs it afresh (its ledger would repeat
            # a refusal stored under the old id) and fences the old id.
            self.send_compensation(s, _next_generation(st), reason=said)
            return
        ready = st.status is StepStatus.PENDING and all(
            self.steps[p].status is StepStatus.SUCCEEDED for p in s.depends_on
        )
        forward_retry = (
            ready
            or st.status is StepStatus.REQUESTED
            or (st.status is StepStatus.TIMED_OUT and not st.compensation_id)
        )
        if not forward_retry:
            raise ActionRefused(
                f"step {s.name!r} is {st.status.value}: only a step awaiting its answer or "
                "ready to be sent, given up without compensation, or whose compensation "
                "failed can be retried"
            )
        if self.status is SagaStatus.COMPENSATING or self._compensation_begun():
            raise ActionRefused("the saga is compensating; retry the compensation or resolve")
        self.note("operator_retry_step", step=s.name, reason=said)
        self.resume_running(said)
        if st.error == LATE_SUCCESS:
            # The command answered after it was given up: that answer is the retry's.
            self.set_step(
                s.name,
                st.evolve(
                    status=StepStatus.SUCCEEDED, given_up=False, error=None, finished_at=self.now
                ),
                "step_succeeded",
                reason=f"its late success is taken ({said})",
            )
            self.advance(trigger="")
            return
        retried = st.evolve(given_up=False)
        if st.error == LATE_FAILURE:
            # The participant refused it; asked under the same id it would only repeat that.
            retried = _next_generation(retried, forward=True)
        self.steps[s.name] = retried
        self.send_action(s, retried, reason=said)

    def operator_skip_step(self, a: OperatorAction) -> None:
        self._refuse_if_final("skip a step")
        s, st = self._operator_step(a)
        said = f"operator {a.actor}: {a.reason}"
        if st.status is StepStatus.COMPENSATING or (
            st.status is StepStatus.COMPENSATION_FAILED
            and (st.error in _UNANSWERED_COMPENSATION or st.generation > 1)
        ):
            # Undone by hand while a compensation may still run would undo it twice: one
            # in flight, one that had no answer or was dead-lettered, or an earlier
            # generation never fenced (the newer one did not run). A retry fences them.
            raise ActionRefused(
                f"a compensation of step {s.name!r} may still run: wait for its answer, "
                "retry it, or resolve the saga"
            )
        if st.status is StepStatus.COMPENSATION_FAILED:
            self.note("operator_skip_step", step=s.name, reason=said)
            self.set_status(SagaStatus.COMPENSATING, self.reason)
            self.set_step(
                s.name,
                st.evolve(status=StepStatus.COMPENSATED, finished_at=self.now, error=None),
                "step_compensated",
                reason=f"undone by hand ({said})",
            )
            self.compensate_ready()
            return
        if st.status not in (StepStatus.REQUESTED, StepStatus.TIMED_OUT, StepStatus.PENDING) or (
            self._compensation_begun() or self.status is SagaStatus.COMPENSATING
        ):
            raise ActionRefused(
                f"step {s.name!r} is {st.status.value}: only a step not yet done (before any "
                "compensation) or a compensation not yet done can be skipped"
            )
        if st.status is StepStatus.PENDING and not all(
            self.steps[p].status is StepStatus.SUCCEEDED for p in s.depends_on
        ):
            raise ActionRefused(f"step {s.name!r} waits for steps that have not succeeded")
        # A command that was sent may still run: unless it is known to have changed
        # nothing, it is fenced (undone if it ran, refused by a tombstone if not).
        fence = st.command_id is not None and st.error != LATE_FAILURE
        if fence and not s.compensable:
            raise ActionRefused(
                f"step {s.name!r} has no compensation, and its command may still take effect; "
                "wait for its answer, or retry it"
            )
        self.note("operator_skip_step", step=s.name, reason=said)
        self.resume_running(said)
        done = st.evolve(
            status=StepStatus.SUCCEEDED,
            finished_at=self.now,
            given_up=False,
            error=None,
            result={"skipped_by": a.actor},
        )
        self.set_step(
            s.name,
            done,
            "step_succeeded",
            reason=f"done by hand ({said})"
            + ("; the command sent earlier is fenced" if fence else ""),
        )
        if fence:
            self.send_fence(s, done.evolve(error=FENCING, compensation_attempt=0))
        self.advance(trigger="")

    def operator_compensate(self, a: OperatorAction) -> None:
        self._refuse_if_final("compensate")
        said = f"operator {a.actor}: {a.reason}"
        if self.status is SagaStatus.COMPENSATING:
            raise ActionRefused("the saga is already compensating")
        self.note("operator_compensate", reason=said)
        # What failed to compensate is undone again, as a new generation; what was given
        # up without compensation is undone too. ``compensate_ready`` sends them, children
        # before parents.
        for s in self.definition.steps:
            st = self.steps[s.name]
            if st.status is StepStatus.COMPENSATION_FAILED:
                self.set_step(
                    s.name,
                    _next_generation(st).evolve(status=StepStatus.SUCCEEDED, error=None),
                    "compensation_queued",
                    reason=said,
                )
        self.begin_compensation(said, given_up_too=True)

    def operator_replay(self, a: OperatorAction) -> None:
        """A held message is published again. What it carries is awaited once more (a
        dead compensation or a given-up command); a saga in review resumes only when
        something is then in flight, so a replay never strands it."""
        said = f"operator {a.actor}: {a.reason}"
        self.note("operator_replay", step=a.step, reason=said)
        s = self.definition.by_name.get(a.step or "")
        awaits = replay_awaits(self.before, a.step, a.message_kind, a.command_id)
        if s is not None and awaits is not None and awaits != "in flight":
            st = self.steps[s.name]
            again = {
                "a dead compensation": st.evolve(status=StepStatus.COMPENSATING, error=None),
                "a given-up command": st.evolve(
                    status=StepStatus.REQUESTED, given_up=False, error=None
                ),
                "a fence": st.evolve(error=FENCING, compensation_attempt=1),
            }[awaits]
            self.set_step(
                s.name,
                again.evolve(deadline=self.now + s.timeout),
                "replay_awaited",
                reason=f"{awaits}, awaited again ({said})",
            )
        if self.status is not SagaStatus.MANUAL_REVIEW:
            return
        if not any(x.in_flight for x in self.steps.values()):
            self.note(
                "saga_not_resumed",
                reason="the replayed message is not one the saga awaits; it stays in review",
            )
            return
        compensating = self._compensation_begun() or any(
            x.status is StepStatus.COMPENSATING for x in self.steps.values()
        )
        if compensating:
            self.set_status(SagaStatus.COMPENSATING, self.reason)
        else:
            self.resume_running(said)
        self.note("saga_resumed", reason=f"resumed for a replay ({said})")

    def operator_resolve(self, a: OperatorAction) -> None:
        if self.status is not SagaStatus.MANUAL_REVIEW:
            raise ActionRefused(
                f"only a saga in MANUAL_REVIEW can be resolved; this one is {self.status.value}"
            )
        try:
            final = SagaStatus(a.resolution or "")
        except ValueError:
            final = SagaStatus.MANUAL_REVIEW
        if final not in TERMINAL_SAGA:
            raise ActionRefused("resolve to COMPLETED, COMPENSATED or FAILED")
        said = f"operator {a.actor}: {a.reason}"
        self.note("operator_resolve", reason=said, detail={"resolution": final.value})
        self.set_status(final, said)
        self.finished_at = self.now
        self.note("saga_resolved", reason=said)

    # -- progress -------------------------------------------------------------------------

    def advance(self, trigger: str) -> None:
        """Move the saga as far as its step states allow."""
        if self.status is SagaStatus.RUNNING:
            if any(st.status is StepStatus.FAILED for st in self.steps.values()):
                self.begin_compensation(trigger)
            else:
                self.dispatch_ready()
                if all(
                    st.status is StepStatus.SUCCEEDED and not st.fencing
                    for st in self.steps.values()
                ):
                    self.finish(SagaStatus.COMPLETED, "saga_completed")
                elif not any(st.in_flight for st in self.steps.values()):
                    # Steps given up earlier (their outcome unknown) hold the rest back.
                    held = [n for n, st in self.steps.items() if st.status is StepStatus.TIMED_OUT]
                    self.manual_review(
                        f"step {held[0]!r} was given up and nothing else is in flight: retry "
                        "it, skip it, compensate or resolve"
                        if held
                        else "nothing is in flight and the saga cannot finish"
                    )
                return
        if self.status is SagaStatus.COMPENSATING:
            self.compensate_ready()

    def resume_running(self, said: str) -> None:
        """An operator sends the saga forward again; a deadline that passed while it
        waited for a person is renewed, or the next sweep would undo what was just sent."""
        self.set_status(SagaStatus.RUNNING, None)
        if self.deadline is not None and self.deadline <= self.now:
            self.deadline = self.now + self.definition.timeout
            self.note(
                "deadline_renewed",
                reason=f"the saga's deadline had passed; now {self.deadline.isoformat()} ({said})",
            )

    def dispatch_ready(self) -> None:
        for s in self.definition.steps:
            st = self.steps[s.name]
            if st.status is not StepStatus.PENDING:
                continue
            if all(self.steps[p].status is StepStatus.SUCCEEDED for p in s.depends_on):
                self.send_action(s, st)

    def begin_compensation(self, reason: str, *, given_up_too: bool = False) -> None:
        self.set_status(SagaStatus.COMPENSATING, reason)
        never_sent = [n for n, st in self.steps.items() if st.status is StepStatus.PENDING]
        for name in never_sent:
            self.steps[name] = self.steps[name].evolve(status=StepStatus.SKIPPED)
        self.note(
            "compensation_started",
            reason=reason,
            detail={"skipped_steps": never_sent} if never_sent else {},
        )
        self.compensate_ready(given_up_too=given_up_too)

    def compensate_ready(self, *, given_up_too: bool = False) -> None:
        """Undo every succeeded step none of whose descendants still holds an effect, and
        every step given up whose policy undoes it (any, with ``given_up_too``: an
        operator's ``compensate``)."""
        blocking = (
            StepStatus.REQUESTED,
            StepStatus.SUCCEEDED,
            StepStatus.COMPENSATING,
            StepStatus.COMPENSATION_FAILED,
        )
        # Reverse dependency order: a child is settled before its parent is looked at.
        for s in reversed(self.definition.steps):
            st = self.steps[s.name]
            if (
                st.status is StepStatus.TIMED_OUT
                and s.compensable
                and (given_up_too or s.late_reply is LateReplyPolicy.COMPENSATE)
                and st.compensation_id is None
            ):
                # Given up while a person was needed elsewhere: it may have taken effect.
                self.send_compensation(s, st)
                continue
            if st.status is not StepStatus.SUCCEEDED or st.fencing:
                continue  # a fence answers first; then the step is compensated like any
            if any(
                self.steps[d].status in blocking or self.steps[d].fencing
                for d in self.definition.descendants(s.name)
            ):
                continue
            if s.compensable:
                self.send_compensation(s, st)
            else:
                self.set_step(
                    s.name,
                    st.evolve(status=StepStatus.COMPENSATION_SKIPPED),
                    "compensation_skipped",
                    reason=f"step {s.name!r} has no compensation; its effect stays",
                )
        undecided = [
            s.name
            for s in self.definition.steps
            if self.steps[s.name].status is StepStatus.TIMED_OUT
            and self.steps[s.name].error == LATE_SUCCESS
            and (not s.compensable or s.late_reply is LateReplyPolicy.MANUAL_REVIEW)
        ]
        if not any(st.status in blocking or st.fencing for st in self.steps.values()):
            if undecided:
                if self.status is not SagaStatus.MANUAL_REVIEW:
                    self.manual_review(
                        f"step {undecided[0]!r} succeeded after it was given up and its effect "
                        "stays: a person must decide (compensate, or resolve)"
                    )
                return
            self.finish(SagaStatus.COMPENSATED, "saga_compensated")
            return
        failed = [n for n, st in self.steps.items() if st.status is StepStatus.COMPENSATION_FAILED]
        if (
            failed
            and self.status is SagaStatus.COMPENSATING
            and not any(st.in_flight for st in self.steps.values())
        ):
            # Nothing more will answer: what is left needs a person.
            self.manual_review(
                f"compensation of step {failed[0]!r} failed ({self.steps[failed[0]].error}) "
                "and nothing else is in flight"
            )

    def send_action(self, s: Step, st: StepState, reason: str | None = None) -> None:
        generation = st.generation
        cid = st.command_id or command_id(
            self.before.saga_id, s.name, MessageKind.COMMAND, generation
        )
        attempt = st.attempt + 1
        new = st.evolve(
            status=StepStatus.REQUESTED,
            attempt=attempt,
            command_id=cid,
            requested_at=self.now,
            deadline=self.now + s.timeout,
        )
        self.set_step(
            s.name,
            new,
            "step_resent" if reason else "step_requested",
            reason=reason,
            detail={"attempt": attempt},
        )
        self.commands.append(
            CommandIntent(
                saga_id=self.before.saga_id,
                step=s.name,
                kind=MessageKind.COMMAND,
                task_name=s.action,
                queue=s.queue,
                command_id=cid,
                message_id=message_id(
                    self.before.saga_id, s.name, MessageKind.COMMAND, generation, attempt
                ),
                attempt=attempt,
                body=self.command_body(),
            )
        )

    def send_compensation(self, s: Step, st: StepState, reason: str | None = None) -> None:
        assert s.compensation is not None
        cid = st.compensation_id or command_id(
            self.before.saga_id, s.name, MessageKind.COMPENSATION, st.generation
        )
        attempt = st.compensation_attempt + 1
        new = st.evolve(
            status=StepStatus.COMPENSATING,
            error=None,
            compensation_attempt=attempt,
            compensation_id=cid,
            requested_at=self.now,
            deadline=self.now + s.timeout,
        )
        self.set_step(
            s.name,
            new,
            "compensation_resent" if reason else "compensation_requested",
            reason=reason,
            detail={"attempt": attempt},
        )
        self.commands.append(self._compensation_intent(s, new, cid, st.generation, attempt))

    def send_fence(self, s: Step, st: StepState, reason: str | None = None) -> None:
        """Send (again) the compensation that fences the command of a step done by hand.

        It uses the compensation id of the step's current generation and moves the step
        to the next one, so a later compensation of the step is a new command.
        """
        generation = st.generation if st.compensation_attempt == 0 else st.generation - 1
        cid = command_id(self.before.saga_id, s.name, MessageKind.COMPENSATION, generation)
        attempt = st.compensation_attempt + 1
        new = st.evolve(
            generation=generation + 1,
            compensation_id=None,
            compensation_attempt=attempt,
            requested_at=self.now,
            deadline=self.now + s.timeout,
        )
        self.set_step(
            s.name,
            new,
            "fence_resent" if reason else "fence_requested",
            reason=reason,
            detail={"attempt": attempt},
        )
        self.commands.append(self._compensation_intent(s, new, cid, generation, attempt))

    def _compensation_intent(
        self, s: Step, st: StepState, cid: str, generation: int, attempt: int
    ) -> CommandIntent:
        assert s.compensation is not None
        saga_id = self.before.saga_id
        return CommandIntent(
            saga_id=saga_id,
            step=s.name,
            kind=MessageKind.COMPENSATION,
            task_name=s.compensation,
            queue=s.queue,
            command_id=cid,
            message_id=message_id(saga_id, s.name, MessageKind.COMPENSATION, generation, attempt),
            attempt=attempt,
            body=self.command_body(),
            compensates=st.command_id,
            supersedes=tuple(
                command_id(saga_id, s.name, MessageKind.COMPENSATION, g)
                for g in range(1, generation)
            ),
        )

    def command_body(self) -> dict[str, Any]:
        results = {n: dict(st.result) for n, st in self.steps.items() if st.result is not None}
        return {"saga_payload": dict(self.before.payload), "results": results}

    # -- endings and anomalies ------------------------------------------------------------

    def finish(self, status: SagaStatus, event: str) -> None:
        # A compensated saga keeps the reason it was compensated for.
        self.set_status(status, self.reason if status is SagaStatus.COMPENSATED else None)
        self.finished_at = self.now
        self.note(event)

    def manual_review(self, reason: str) -> None:
        if self.status in TERMINAL_SAGA and self.classification is Classification.ACCEPTED:
            self.classification = Classification.LATE  # it reopens a saga that had ended
        self.changed = True
        self.set_status(SagaStatus.MANUAL_REVIEW, reason)
        self.note("manual_review", reason=reason)

    def conflict(self, event: ReplyReceived, reason: str) -> None:
        self.classification = Classification.CONFLICTING
        self.note("conflicting_reply", step=event.step, message_id=event.message_id, reason=reason)
        if self.status is not SagaStatus.MANUAL_REVIEW:
            self.manual_review(f"conflicting replies: {reason}")

    def invalid(self, event: ReplyReceived, reason: str) -> None:
        self.classification = Classification.INVALID
        self.note("invalid_message", step=event.step, message_id=event.message_id, reason=reason)

    # -- bookkeeping ----------------------------------------------------------------------

    def set_status(self, status: SagaStatus, reason: str | None) -> None:
        self.changed = True
        self.status = status
        self.reason = reason
        if status not in TERMINAL_SAGA:
            self.finished_at = None

    def set_step(
        self,
        name: str,
        new: StepState,
        event: str,
        *,
        message_id: str | None = None,
        reason: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        old = self.steps[name]
        self.steps[name] = new
        self.changed = True
        self.history.append(
            HistoryEntry(
                event=event,
                saga_status_before=self.status,
                saga_status_after=self.status,
                step=name,
                step_status_before=old.status,
                step_status_after=new.status,
                message_id=message_id,
                reason=reason,
                detail=dict(detail or {}),
            )
        )

    def note(
        self,
        event: str,
        *,
        step: str | None = None,
        message_id: str | None = None,
        reason: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        st = self.steps.get(step) if step else None
        self.history.append(
            HistoryEntry(
                event=event,
                saga_status_before=self.status,
                saga_status_after=self.status,
                step=step,
                step_status_before=st.status if st else None,
                step_status_after=st.status if st else None,
                message_id=message_id,
                reason=reason,
                detail=dict(detail or {}),
            )
        )

    def decision(self) -> Decision:
        if (
            self.changed
            and self.status in ACTIVE_SAGA
            and not any(st.in_flight for st in self.steps.values())
        ):
            # No reply and no deadline would ever move this saga again. The rules above
            # are meant to leave no such state; should one be reached, a person sees it.
            stuck = ", ".join(f"{n} {st.status.value}" for n, st in self.steps.items())
            self.note("no_way_forward", reason=f"nothing is in flight ({stuck})")
            self.manual_review(f"the saga has no way forward: nothing is in flight ({stuck})")
        # History entries say the saga status before and after the whole decision,
        # so a reader sees each transition once, on the entry that made it.
        entries = tuple(_fix_status(h, self.before.status, self.status) for h in self.history)
        if not self.changed:
            return Decision(self.before, (), entries, self.classification, changed=False)
        state = replace(
            self.before,
            status=self.status,
            reason=self.reason,
            deadline=self.deadline,
            finished_at=self.finished_at,
            steps=dict(self.steps),
            version=self.before.version + 1,
        )
        return Decision(state, tuple(self.commands), entries, self.classification, changed=True)


_UNANSWERED_COMPENSATION = frozenset({"no_answer", "dead_lettered"})
"""Errors of a compensation given up without an answer: a success later completes it."""


def _next_generation(st: StepState, *, forward: bool = False) -> StepState:
    """The step's next generation: its compensation (and with ``forward`` its command)
    gets a new id, which the participant runs afresh."""
    if st.generation >= MAX_GENERATIONS:
        raise ActionRefused(
            f"the step was retried {st.generation} times, the most a command may name as "
            "superseded; resolve the saga"
        )
    new = st.evolve(generation=st.generation + 1, compensation_id=None, compensation_attempt=0)
    if forward:
        new = new.evolve(command_id=None, attempt=0, error=None, result=None)
    return new


def _fix_status(entry: HistoryEntry, before: SagaStatus, after: SagaStatus) -> HistoryEntry:
    return replace(entry, saga_status_before=before, saga_status_after=after)


def _error_text(event: ReplyReceived) -> str:
    code = event.error_code or "failed"
    return f"{code}: {event.error_message}" if event.error_message else code
