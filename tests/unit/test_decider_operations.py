"""Operator actions and give-ups that must leave every saga a way forward.

Each test pins one scenario that used to strand a saga, re-run a refusal, or let an
effect double: operator retries are new generations, a late answer is kept, a
dead-lettered compensation that succeeds completes, a step done by hand fences its
command, a compensating saga past its deadline is not due forever.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from saga_tasks.core.decider import decide, hand_over
from saga_tasks.core.definitions import saga, step
from saga_tasks.core.events import DeadLettered, DeadlinePassed, OperatorAction, OperatorVerb
from saga_tasks.core.model import LATE_SUCCESS
from saga_tasks.core.states import MessageKind, Outcome, SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused
from tests.unit.sagas import Driver, check, linear


def act(d: Driver, verb: OperatorVerb, step_name: str | None = None, **kw: object):
    return d.apply(OperatorAction(verb, actor="ana", reason="ticket 7", step=step_name, **kw))


def refused_compensations(d: Driver, *names: str) -> None:
    for name in names:
        d.compensated(name, Outcome.FAILURE)


def test_retrying_a_refused_compensation_sends_a_new_generation():
    d = Driver(linear(3))
    d.start()
    d.succeed("s0")
    d.succeed("s1")
    d.fail("s2")
    d.compensated("s1")
    refused_compensations(d, "s0")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    old = d.state.steps["s0"]

    decision = act(d, OperatorVerb.RETRY_STEP, "s0")

    (command,) = decision.commands
    assert command.kind is MessageKind.COMPENSATION
    assert command.command_id != old.compensation_id, "the ledger would repeat the refusal"
    assert command.supersedes == (old.compensation_id,)
    assert command.compensates == old.command_id
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED


def test_operator_compensate_retries_a_refused_compensation_under_a_new_id():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    refused_compensations(d, "s0")
    old_id = d.state.steps["s0"].compensation_id
    # From review, compensate sends the compensation again as a new command.
    decision = act(d, OperatorVerb.COMPENSATE)
    (command,) = decision.commands
    assert command.command_id != old_id
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED


def test_a_reply_of_a_superseded_compensation_is_late_not_invalid():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    first = d.reply("s0", Outcome.FAILURE, kind=MessageKind.COMPENSATION)
    d.apply(first)
    act(d, OperatorVerb.RETRY_STEP, "s0")
    again = d.apply(first.__class__(**{**first.__dict__, "message_id": "again"}))
    assert again.classification.value == "late"
    # A success of the old id means the step is undone after all.
    old_success = d.reply("s0", kind=MessageKind.COMPENSATION, command_id=first.command_id)
    d.apply(old_success)
    assert d.state.steps["s0"].status is StepStatus.COMPENSATED
    assert d.state.status is SagaStatus.COMPENSATED


def test_one_compensation_retried_while_another_stays_refused_goes_to_review_not_limbo():
    d = Driver(linear(3))
    d.start()
    d.succeed("s0")
    d.succeed("s1")
    d.fail("s2")
    refused_compensations(d, "s1")
    # s0 waits for s1 (children first); an operator retries s1, which is refused again...
    act(d, OperatorVerb.RETRY_STEP, "s1")
    d.compensated("s1")
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED


def test_a_succeeded_retry_beside_a_still_refused_compensation_hands_the_saga_to_a_person():
    defn = saga(
        "fan",
        step("a", "p.a", compensation="p.ua", queue="p.commands", depends_on=[]),
        step("b", "p.b", compensation="p.ub", queue="p.commands", depends_on=[]),
        step("c", "p.c", compensation="p.uc", queue="p.commands", depends_on=["a", "b"]),
    )
    d = Driver(defn)
    d.start()
    d.succeed("a")
    d.succeed("b")
    d.fail("c")
    refused_compensations(d, "a", "b")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    act(d, OperatorVerb.RETRY_STEP, "a")
    assert d.state.status is SagaStatus.COMPENSATING
    d.compensated("a")
    # b's compensation is still refused and nothing is in flight: a person must act.
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "compensation of step 'b'" in (d.state.reason or "")
    act(d, OperatorVerb.COMPENSATE)
    d.compensated("b")
    assert d.state.status is SagaStatus.COMPENSATED


def command_dead_lettered(d: Driver, step_name: str) -> None:
    """The step's command reached the dead-letter queue: a step that cannot be undone is
    given up and its saga handed to a person (silence alone never does that)."""
    d.apply(
        DeadLettered(
            kind=MessageKind.COMMAND,
            step=step_name,
            command_id=d.state.steps[step_name].command_id,
            message_id=f"dead-{step_name}",
            reason="retries spent",
            held_id=1,
        )
    )


def compensation_dead_lettered(reason: str):
    """s1 failed; s0's compensation reached the dead-letter queue."""
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    st = d.state.steps["s0"]
    d.apply(
        DeadLettered(
            kind=MessageKind.COMPENSATION,
            step="s0",
            command_id=st.compensation_id,
            message_id="dead-1",
            reason=reason,
            held_id=1,
        )
    )
    return d, st


def test_a_dead_lettered_compensation_that_succeeds_later_completes():
    d, _ = compensation_dead_lettered("retries spent")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    # The sweeper's second send of the same compensation succeeds after all.
    decision = d.compensated("s0")
    assert decision.classification.value == "late"
    assert decision.changed, "not a conflict: the compensation ran"
    assert d.state.steps["s0"].status is StepStatus.COMPENSATED
    assert d.state.status is SagaStatus.MANUAL_REVIEW, "only a person takes it out of review"
    act(d, OperatorVerb.COMPENSATE)
    assert d.state.status is SagaStatus.COMPENSATED


def test_a_replayed_dead_compensation_that_succeeds_completes():
    d, st = compensation_dead_lettered("poison")
    act(
        d,
        OperatorVerb.REPLAY,
        "s0",
        message_kind=MessageKind.COMPENSATION,
        command_id=st.compensation_id,
    )
    assert d.state.status is SagaStatus.COMPENSATING
    assert d.state.steps["s0"].status is StepStatus.COMPENSATING, "awaited again, with a deadline"
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED


def test_a_compensating_saga_past_its_own_deadline_is_not_due_for_it():
    short = saga(
        "short",
        step("s0", "p.do0", compensation="p.undo0", queue="p.commands", timeout=30),
        step("s1", "p.do1", compensation="p.undo1", queue="p.commands", timeout=30),
        timeout=60,
    )
    d = Driver(short)
    d.start()
    d.succeed("s0")
    d.fail("s1")
    assert d.state.status is SagaStatus.COMPENSATING
    # The saga's deadline (60 s) passes while its compensation waits (30 s timeout,
    # sent five times): every wake-up the sweeper is given must be acted on.
    for _ in range(12):
        before = d.state
        wake = before.next_wake_at()
        if wake is None:
            break
        d.now = max(d.now, wake)
        decision = decide(d.definition, before, DeadlinePassed(), d.now + timedelta(seconds=1))
        d.state = decision.state
        after = decision.state.next_wake_at()
        assert after is None or after > d.now + timedelta(seconds=1), "claimed again and again"
    # Sent again and again (never answered), never handed over for silence alone.
    assert d.state.status is SagaStatus.COMPENSATING
    assert d.state.steps["s0"].compensation_attempt == 13


def test_retrying_a_step_whose_late_success_was_recorded_takes_that_success():
    d = Driver(linear(2, compensable=[False, True]))
    d.start()
    cid = d.state.steps["s0"].command_id
    command_dead_lettered(d, "s0")
    assert d.state.status is SagaStatus.MANUAL_REVIEW  # cannot be undone, outcome unknown
    d.apply(d.reply("s0", command_id=cid, result={"order": 9}))
    assert d.state.steps["s0"].error == LATE_SUCCESS
    decision = act(d, OperatorVerb.RETRY_STEP, "s0")
    assert d.state.steps["s0"].status is StepStatus.SUCCEEDED
    assert d.state.steps["s0"].result == {"order": 9}
    assert [c.step for c in decision.commands] == ["s1"], "nothing asked again, the next sent"
    assert d.state.status is SagaStatus.RUNNING


def test_retrying_a_step_whose_late_refusal_was_recorded_sends_a_new_command():
    d = Driver(linear(2, compensable=[False, True]))
    d.start()
    cid = d.state.steps["s0"].command_id
    command_dead_lettered(d, "s0")
    d.apply(d.reply("s0", Outcome.FAILURE, command_id=cid))
    decision = act(d, OperatorVerb.RETRY_STEP, "s0")
    (command,) = decision.commands
    assert command.command_id != cid, "the ledger would repeat the refusal"
    # The old command's answers are late, not invalid.
    late = d.apply(d.reply("s0", Outcome.FAILURE, command_id=cid))
    assert late.classification.value == "late"
    d.succeed("s0")
    assert d.state.steps["s0"].status is StepStatus.SUCCEEDED


def test_skipping_a_step_in_flight_fences_its_command():
    d = Driver(linear(2))
    d.start()
    cid = d.state.steps["s0"].command_id
    decision = act(d, OperatorVerb.SKIP_STEP, "s0")
    fence = next(c for c in decision.commands if c.kind is MessageKind.COMPENSATION)
    assert fence.compensates == cid
    assert d.state.steps["s0"].status is StepStatus.SUCCEEDED
    assert "fenced" in " ".join(h.reason or "" for h in decision.history)
    d.succeed("s1")
    assert d.state.status is SagaStatus.RUNNING, "not complete while the fence is out"
    d.apply(d.reply("s0", kind=MessageKind.COMPENSATION, command_id=fence.command_id))
    assert d.state.status is SagaStatus.COMPLETED
    # The late answer of the fenced command changes nothing.
    late = d.apply(d.reply("s0", command_id=cid))
    assert not late.changed


def test_a_fence_refused_hands_the_saga_to_a_person():
    d = Driver(linear(2))
    d.start()
    decision = act(d, OperatorVerb.SKIP_STEP, "s0")
    fence = next(c for c in decision.commands if c.kind is MessageKind.COMPENSATION)
    d.apply(
        d.reply("s0", Outcome.FAILURE, kind=MessageKind.COMPENSATION, command_id=fence.command_id)
    )
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "may be doubled" in (d.state.reason or "")


def test_a_saga_whose_fence_failed_does_not_complete_behind_a_persons_back():
    # a was done by hand; its fence was dead-lettered (the command may have run: its effect
    # may be doubled) and the saga went to review for it. A replay of b's held command
    # resumes the saga, and b answers: the saga must not complete as if a were settled.
    defn = saga(
        "fenced",
        step("a", "p.a", compensation="p.ua", queue="p.commands", depends_on=[]),
        step("b", "p.b", compensation="p.ub", queue="p.commands", depends_on=[],
             on_dead_letter="manual_review"),
    )  # fmt: skip
    d = Driver(defn)
    d.start()
    b_cid = d.state.steps["b"].command_id
    d.apply(DeadLettered(MessageKind.COMMAND, "b", b_cid, "m-b", "rejected", 1))
    fence = next(c for c in act(d, OperatorVerb.SKIP_STEP, "a").commands if c.step == "a")
    d.apply(DeadLettered(MessageKind.COMPENSATION, "a", fence.command_id, "m-f", "rejected", 2))
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    act(d, OperatorVerb.REPLAY, "b", message_kind=MessageKind.COMMAND, command_id=b_cid)
    assert d.state.status is SagaStatus.RUNNING
    before = d.state
    decision = d.succeed("b")
    check(defn, before, decision)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "'a'" in (d.state.reason or "") and "fence" in (d.state.reason or "")
    # Replaying the held fence awaits it again; once it answers, the saga completes.
    act(d, OperatorVerb.REPLAY, "a", message_kind=MessageKind.COMPENSATION,
        command_id=fence.command_id)  # fmt: skip
    assert d.state.status is SagaStatus.RUNNING
    d.apply(d.reply("a", kind=MessageKind.COMPENSATION, command_id=fence.command_id))
    assert d.state.status is SagaStatus.COMPLETED


def test_a_fence_is_sent_again_when_it_has_no_answer():
    d = Driver(linear(2))
    d.start()
    first = next(
        c
        for c in act(d, OperatorVerb.SKIP_STEP, "s0").commands
        if c.kind is MessageKind.COMPENSATION
    )
    again = d.lapse()
    resent = [c for c in again.commands if c.step == "s0"]
    assert [c.command_id for c in resent] == [first.command_id]
    assert resent[0].message_id != first.message_id


def test_a_compensation_after_a_fence_is_a_new_command_that_names_the_fence():
    d = Driver(linear(2))
    d.start()
    fence = next(
        c
        for c in act(d, OperatorVerb.SKIP_STEP, "s0").commands
        if c.kind is MessageKind.COMPENSATION
    )
    d.apply(d.reply("s0", kind=MessageKind.COMPENSATION, command_id=fence.command_id))
    decision = d.fail("s1")
    (undo,) = decision.commands
    assert undo.command_id != fence.command_id
    assert fence.command_id in undo.supersedes


def test_skipping_a_step_in_flight_without_compensation_is_refused():
    d = Driver(linear(2, compensable=[False, True]))
    d.start()
    with pytest.raises(ActionRefused, match="no compensation"):
        act(d, OperatorVerb.SKIP_STEP, "s0")


def test_hand_over_moves_a_saga_to_review_with_the_reason():
    d = Driver(linear(1))
    d.start()
    decision = hand_over(d.state, "saga type 'linear' version 9 is not loaded", now=d.now)
    assert decision.state.status is SagaStatus.MANUAL_REVIEW
    assert decision.state.version == d.state.version + 1
    assert decision.state.next_wake_at() is None
    assert decision.history[0].reason == "saga type 'linear' version 9 is not loaded"


def test_compensate_is_refused_while_a_step_that_cannot_be_undone_is_awaited():
    """An operator compensates while the last step (no compensation: the order's confirm)
    is in flight. Were it to succeed then, the compensation would undo what it builds on
    and call that COMPENSATED (an order confirmed, its stock released, its payment
    voided). The action is refused and nothing changes; once it answers, a person
    decides with the answer in hand."""
    d = Driver(linear(3, compensable=[True, True, False]))
    d.start()
    d.succeed("s0")
    d.succeed("s1")
    before = d.state
    with pytest.raises(ActionRefused, match="'s2' cannot be undone and its answer is awaited"):
        act(d, OperatorVerb.COMPENSATE)
    assert d.state == before
    d.succeed("s2")
    assert d.state.status is SagaStatus.COMPLETED


def test_compensate_is_refused_once_a_step_that_cannot_be_undone_has_succeeded():
    """Found by the chaos run: an order confirmed (no compensation) while a skipped
    payment's fence was awaited; an operator's compensate was accepted, skipped the
    confirm ("its effect stays") and cancelled the order underneath it, which the order
    service refuses for a confirmed order: a saga COMPENSATED with its order confirmed.
    What a step that cannot be undone built on must stay, so the action is refused and
    nothing changes; the definition's own rule (a later step failing) is unchanged."""
    d = Driver(linear(3, compensable=[True, False, True]))
    d.start()
    d.succeed("s0")
    d.succeed("s1")
    before = d.state
    with pytest.raises(ActionRefused, match="'s1' cannot be undone and has succeeded"):
        act(d, OperatorVerb.COMPENSATE)
    assert d.state == before
    d.fail("s2")
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED
    assert d.state.steps["s1"].status is StepStatus.COMPENSATION_SKIPPED


def test_compensate_is_refused_once_a_step_that_cannot_be_undone_succeeded_late():
    """Given up (no answer after its attempts: the saga is in review), then its success
    came: it took effect as surely as one answered in time, and what it built on stays."""
    d = Driver(linear(2, compensable=[True, False]))
    d.start()
    d.succeed("s0")
    cid = d.state.steps["s1"].command_id
    command_dead_lettered(d, "s1")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    d.apply(d.reply("s1", command_id=cid))
    assert d.state.steps["s1"].error == LATE_SUCCESS
    before = d.state
    with pytest.raises(ActionRefused, match="'s1' cannot be undone and succeeded after"):
        act(d, OperatorVerb.COMPENSATE)
    assert d.state == before


def test_a_step_that_cannot_be_undone_and_failed_siblings_keep_the_old_rule():
    """Without an operator the definition's rule stands: a step with no compensation keeps
    its effect while the rest is undone."""
    d = Driver(linear(2, compensable=[False, True]))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    assert d.state.status is SagaStatus.COMPENSATED
    assert d.state.steps["s0"].status is StepStatus.COMPENSATION_SKIPPED
