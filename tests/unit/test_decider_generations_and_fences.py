"""Operator generations, fences, late answers and the sweeper's hand-over.

Each test pins one ordering or operator action that the decider (or the sweep shell
around it) got wrong. A test still marked ``xfail(strict=True)`` is a known defect, named
by its reason; once it is fixed the strict marker fails the run until it is removed.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from saga_tasks.core.clock import FakeClock
from saga_tasks.core.decider import Decision
from saga_tasks.core.definitions import saga, step
from saga_tasks.core.events import DeadLettered, OperatorAction, OperatorVerb
from saga_tasks.core.messages import MAX_GENERATIONS
from saga_tasks.core.model import LATE_SUCCESS, SagaState
from saga_tasks.core.registry import Registry
from saga_tasks.core.states import Classification, MessageKind, Outcome, SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused
from saga_tasks.runtime.sweeper import Sweeper, SweepReport
from tests.unit.sagas import Driver, check, linear


def act(d: Driver, verb: OperatorVerb, step_name: str | None = None, **kw: object) -> Decision:
    return d.apply(OperatorAction(verb, actor="ana", reason="ticket 9", step=step_name, **kw))


def fence_of(decision: Decision):
    (fence,) = [c for c in decision.commands if c.kind is MessageKind.COMPENSATION]
    return fence


def fan_out(*, retry_a: int, retry_b: int):
    """Two roots sent together, with their own retry policies, and a join."""
    return saga(
        "fan",
        step("a", "p.a", compensation="p.ua", queue="p.commands", depends_on=[], retry=retry_a),
        step("b", "p.b", compensation="p.ub", queue="p.commands", depends_on=[], retry=retry_b),
        step("c", "p.c", compensation="p.uc", queue="p.commands", depends_on=["a", "b"]),
    )


def sweep_shell(definition, state: SagaState, now) -> Decision:
    """What ``Sweeper.sweep`` decides for one claimed saga (no database involved)."""
    sweeper = Sweeper(
        engine=lambda: None,  # type: ignore[arg-type,return-value]
        registry=Registry([definition]),
        topology=None,  # type: ignore[arg-type]
        outlet=lambda: None,  # type: ignore[arg-type,return-value]
        clock=FakeClock(),
    )
    ((_, _, decision),) = sweeper._decide_due([state], now, SweepReport(), {}, {})
    return decision


# -- the sweeper ---------------------------------------------------------------------------


def test_a_due_step_whose_resend_is_dropped_for_a_sibling_give_up_is_not_left_due():
    d = Driver(fan_out(retry_a=1, retry_b=3))
    d.start()
    d.tick(31)  # both silent: a has spent its one attempt, b may be sent again
    assert d.state.status is SagaStatus.COMPENSATING
    assert d.state.steps["b"].status is StepStatus.REQUESTED
    wake = d.state.next_wake_at()
    assert wake is None or wake > d.now, (
        f"the sweep left b due at {wake} (now {d.now}): every sweep claims it again"
    )


def test_the_sweeper_does_not_hand_over_a_saga_whose_sibling_step_was_given_up():
    d = Driver(fan_out(retry_a=1, retry_b=3))
    d.start()
    now = d.now + timedelta(seconds=31)
    decision = sweep_shell(d.definition, d.state, now)
    assert decision.state.status is SagaStatus.COMPENSATING, (
        f"an ordinary timeout went to review: {decision.state.reason}"
    )
    assert [c.step for c in decision.commands] == ["a"], "a's compensation is sent"


# -- operators after the saga's own deadline ------------------------------------------------


def in_review_past_its_deadline() -> Driver:
    """s0's command dead-lettered (policy: a person decides); the person looks two hours
    later, long after the saga's ten-minute deadline."""
    d = Driver(
        saga(
            "late-operator",
            step(
                "s0", "p.a", compensation="p.ua", queue="p.commands", on_dead_letter="manual_review"
            ),
            step("s1", "p.b", compensation="p.ub", queue="p.commands"),
            timeout=600,
        )
    )
    d.start()
    cid = d.state.steps["s0"].command_id
    d.apply(
        DeadLettered(
            kind=MessageKind.COMMAND,
            step="s0",
            command_id=cid,
            message_id="dead-1",
            reason="retries exhausted",
            held_id=1,
        )
    )
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    d.now += timedelta(hours=2)
    return d


@pytest.mark.parametrize(
    "verb", [OperatorVerb.RETRY_STEP, OperatorVerb.SKIP_STEP, OperatorVerb.REPLAY]
)
def test_a_step_an_operator_resumes_after_the_saga_deadline_gets_its_chance(verb):
    d = in_review_past_its_deadline()
    cid = d.state.steps["s0"].command_id
    extra = (
        {"message_kind": MessageKind.COMMAND, "command_id": cid}
        if verb is OperatorVerb.REPLAY
        else {}
    )
    decision = act(d, verb, "s0", **extra)
    assert d.state.status is SagaStatus.RUNNING
    # Asked again (retry), sent next (skip: s0 done by hand, s1 goes), or the held one (replay).
    awaited = [c.step for c in decision.commands if c.kind is MessageKind.COMMAND] or ["s0"]
    d.tick(1)  # the next sweep, well before the step's own 30 s deadline
    for name in awaited:
        assert d.state.steps[name].status is StepStatus.REQUESTED, (
            f"{name} given up one second after the operator acted: {d.state.reason}"
        )
    assert d.state.status is SagaStatus.RUNNING
    if verb is OperatorVerb.SKIP_STEP:
        return  # s0 is done by hand; s1 was checked above
    d.tick(1)  # the next sweep, well before the step's own 30 s deadline
    assert d.state.steps["s0"].status is StepStatus.REQUESTED, (
        f"given up one second after the operator asked again: {d.state.reason}"
    )
    assert d.state.status is SagaStatus.RUNNING


# -- fences ---------------------------------------------------------------------------------


def skipped_and_fenced() -> tuple[Driver, str]:
    """s0 done by hand while its command C1 was in flight; the fence reached the
    participant first, so C1 met a tombstone there; s1 then failed."""
    d = Driver(linear(2))
    d.start()
    c1 = d.state.steps["s0"].command_id
    assert c1 is not None
    fence = fence_of(act(d, OperatorVerb.SKIP_STEP, "s0"))
    d.apply(
        d.reply(
            "s0",
            kind=MessageKind.COMPENSATION,
            command_id=fence.command_id,
            result={"nothing_to_undo": "a tombstone now refuses it"},
        )
    )
    d.fail("s1")
    assert d.state.steps["s0"].status is StepStatus.COMPENSATING
    return d, c1


@pytest.mark.parametrize("when", ["compensating", "compensated"])
def test_the_refusal_of_a_fenced_command_is_late_not_a_conflict(when):
    d, c1 = skipped_and_fenced()
    if when == "compensated":
        d.compensated("s0")
        assert d.state.status is SagaStatus.COMPENSATED
    refusal = d.reply("s0", Outcome.FAILURE, command_id=c1, code="compensated_before_execution")
    decision = d.apply(refusal)
    assert decision.classification is not Classification.CONFLICTING, decision.history
    assert d.state.status is not SagaStatus.MANUAL_REVIEW, d.state.reason


def test_skipping_a_compensation_in_flight_fences_it_or_is_refused():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    in_flight = d.state.steps["s0"].compensation_id
    assert d.state.steps["s0"].status is StepStatus.COMPENSATING
    try:
        decision = act(d, OperatorVerb.SKIP_STEP, "s0")
    except ActionRefused:
        return  # acceptable: wait for its answer, or retry it
    fenced = any(in_flight in c.supersedes for c in decision.commands)
    assert fenced, "nothing makes the compensation still in flight harmless"
    late = d.apply(
        d.reply("s0", Outcome.FAILURE, kind=MessageKind.COMPENSATION, command_id=in_flight)
    )
    assert late.classification is not Classification.CONFLICTING


def test_a_dead_lettered_fence_is_not_ignored_as_moved_on():
    d = Driver(linear(2))
    d.start()
    fence = fence_of(act(d, OperatorVerb.SKIP_STEP, "s0"))
    decision = d.apply(
        DeadLettered(
            kind=MessageKind.COMPENSATION,
            step="s0",
            command_id=fence.command_id,
            message_id=fence.message_id,
            reason="poison: its worker died on it 3 times",
            held_id=4,
        )
    )
    said = " ".join(h.reason or "" for h in decision.history)
    assert "moved on" not in said, said
    # Like any dead compensation: a person decides (and may replay it).
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "fence" in (d.state.reason or ""), d.state.reason


def test_a_fence_that_answers_after_it_was_given_up_is_recorded_as_the_fence():
    d = Driver(linear(2))
    d.start()
    fence = fence_of(act(d, OperatorVerb.SKIP_STEP, "s0"))
    for _ in range(12):  # no answer: sent again until the compensation policy is spent
        if d.state.steps["s0"].error == "fence_failed":
            break
        d.lapse()
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["s0"].error == "fence_failed"
    decision = d.apply(d.reply("s0", kind=MessageKind.COMPENSATION, command_id=fence.command_id))
    said = " ".join(h.reason or "" for h in decision.history)
    assert "superseded" not in said, said
    assert d.state.steps["s0"].error is None, "the fence did answer: the step is fenced"


# -- generations ----------------------------------------------------------------------------


def test_an_operator_retry_never_sends_what_the_participant_parks_as_invalid():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    d.compensated("s0", Outcome.FAILURE)
    for _ in range(MAX_GENERATIONS + 1):
        try:
            decision = act(d, OperatorVerb.RETRY_STEP, "s0")
        except ActionRefused:
            return  # a bounded number of generations, refused with a reason: fine
        (command,) = decision.commands
        assert len(command.supersedes) <= MAX_GENERATIONS, (
            f"generation {d.state.steps['s0'].generation}: the participant refuses this "
            "message as invalid and runs nothing"
        )
        d.compensated("s0", Outcome.FAILURE)


# -- ways out of review ---------------------------------------------------------------------


def test_a_saga_whose_step_succeeded_during_review_can_go_on():
    d = Driver(
        saga(
            "resume",
            step(
                "s0", "p.a", compensation="p.ua", queue="p.commands", on_dead_letter="manual_review"
            ),
            step("s1", "p.b", compensation="p.ub", queue="p.commands"),
        )
    )
    d.start()
    cid = d.state.steps["s0"].command_id
    # The broker dead-letters the command after the participant ran it (its worker died
    # after commit, before the ack); the participant's reply still arrives.
    d.apply(
        DeadLettered(
            kind=MessageKind.COMMAND,
            step="s0",
            command_id=cid,
            message_id="dead-1",
            reason="delivery limit",
            held_id=1,
        )
    )
    d.succeed("s0")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["s1"].status is StepStatus.PENDING
    decision = act(d, OperatorVerb.RETRY_STEP, "s1")
    assert d.state.status is SagaStatus.RUNNING
    assert [c.step for c in decision.commands] == ["s1"]


# -- a late success that needs a person -----------------------------------------------------


def test_a_late_success_under_manual_review_is_not_closed_by_an_unrelated_retry():
    d = Driver(
        saga(
            "late-mr",
            step("a", "p.a", compensation="p.ua", queue="p.commands", depends_on=[],
                 late_reply="manual_review"),
            step("b", "p.b", compensation="p.ub", queue="p.commands", depends_on=[], timeout=100),
            step("c", "p.c", compensation="p.uc", queue="p.commands", depends_on=["a", "b"]),
        )
    )  # fmt: skip
    d.start()
    a_cid = d.state.steps["a"].command_id
    d.succeed("b")
    for _ in range(3):
        d.lapse()  # a is given up; by its policy it is left TIMED_OUT; b is compensated
    d.apply(d.reply("a", command_id=a_cid))  # a's late success: a person must decide
    assert d.state.steps["a"].error == LATE_SUCCESS
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    d.compensated("b", Outcome.FAILURE)
    act(d, OperatorVerb.RETRY_STEP, "b")  # the person fixes b's compensation only
    d.compensated("b")
    assert d.state.status is not SagaStatus.COMPENSATED, (
        "COMPENSATED while a's late success is in place and nobody decided on it"
    )


# -- found by the strict stateful model ---------------------------------------------------


def test_a_refused_retry_beside_an_older_generation_that_undid_the_step_is_not_a_conflict():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    first = d.state.steps["s0"].compensation_id
    act(d, OperatorVerb.RETRY_STEP, "s0")  # the first is slow; a person sends it again
    second = d.state.steps["s0"].compensation_id
    assert second != first
    # At the participant the second ran first and was refused (rolling back its tombstone
    # of the first), then the first ran and undid the step. Their replies arrive in turn.
    d.apply(d.reply("s0", kind=MessageKind.COMPENSATION, command_id=first))
    assert d.state.status is SagaStatus.COMPENSATED
    decision = d.apply(
        d.reply("s0", Outcome.FAILURE, kind=MessageKind.COMPENSATION, command_id=second)
    )
    assert decision.classification is not Classification.CONFLICTING, decision.history
    assert d.state.status is SagaStatus.COMPENSATED, d.state.reason


def test_operator_compensate_undoes_a_given_up_child_before_its_parent():
    d = Driver(
        saga(
            "order",
            step("s0", "p.do0", compensation="p.undo0", queue="p.commands"),
            step("s1", "p.do1", compensation="p.undo1", queue="p.commands", retry=1,
                 late_reply="ignore"),
        )
    )  # fmt: skip
    d.start()
    d.succeed("s0")
    d.tick(31)  # s1 silent: given up, left TIMED_OUT by its policy; s0 is compensated
    assert d.state.steps["s1"].status is StepStatus.TIMED_OUT
    d.compensated("s0", Outcome.FAILURE)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    decision = act(d, OperatorVerb.COMPENSATE)
    assert [c.step for c in decision.commands] == ["s1"], "the child first, then its parent"


def test_a_compensation_after_a_failed_fence_gets_its_own_attempts():
    d = Driver(linear(2, timeout=3600))  # the fence's attempts, with their backoff, fit
    d.start()
    act(d, OperatorVerb.SKIP_STEP, "s0")
    d.succeed("s1")
    for _ in range(5):
        d.lapse()  # the fence has no answer, five times (s1 answered: nothing else waits)
    assert d.state.steps["s0"].error == "fence_failed"
    act(d, OperatorVerb.COMPENSATE)
    (undo,) = d.compensated("s1").commands
    assert undo.step == "s0"
    assert undo.attempt == 1, f"the first send of s0's compensation is attempt {undo.attempt}"
    resent = d.lapse()
    assert [c.step for c in resent.commands] == ["s0"], d.state.reason


@pytest.mark.xfail(
    strict=True,
    reason="a retry of a refused compensation keeps the review reason, and the saga ends "
    "COMPENSATED saying 'compensation ... was refused' instead of why it was compensated",
)
def test_a_saga_compensated_after_a_retry_says_why_it_was_compensated():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1", code="declined")
    why = d.state.reason
    d.compensated("s0", Outcome.FAILURE)
    act(d, OperatorVerb.RETRY_STEP, "s0")
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED
    assert d.state.reason == why, d.state.reason


def test_a_fence_answering_after_the_saga_compensates_the_step_counts_as_its_undo():
    """Found by the stateful world: a fence given up (dead-lettered), the saga then
    compensated by an operator, and the fence's re-send answers. It undid the command the
    compensation is for, so the step is undone; the compensation awaited is not stranded
    without a deadline."""
    d = Driver(linear(1))
    d.start()
    fence = fence_of(act(d, OperatorVerb.SKIP_STEP, "s0"))
    d.apply(
        DeadLettered(
            kind=MessageKind.COMPENSATION,
            step="s0",
            command_id=fence.command_id,
            message_id=fence.message_id,
            reason="rejected",
            held_id=1,
        )
    )
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    act(d, OperatorVerb.COMPENSATE)
    assert d.state.steps["s0"].status is StepStatus.COMPENSATING
    d.apply(d.reply("s0", kind=MessageKind.COMPENSATION, command_id=fence.command_id))
    assert d.state.steps["s0"].status is StepStatus.COMPENSATED
    assert d.state.status is SagaStatus.COMPENSATED


def test_a_parents_compensation_is_not_sent_again_while_its_child_is_undone_first():
    """A child given up (late replies ignored) let its parent's compensation go out; a
    person's ``compensate`` then undoes the child too. The parent's copy, due again,
    waits for the child: children before parents (found by the stateful world)."""
    defn = saga(
        "stateful",
        step("s0", "p.do0", queue="p.commands", compensation="p.undo0", timeout=2, retry=1,
             compensation_retry=1, on_dead_letter="manual_review", depends_on=()),
        step("s1", "p.do1", queue="p.commands", compensation="p.undo1", timeout=2, retry=1,
             compensation_retry=1, depends_on=()),
        step("s2", "p.do2", queue="p.commands", compensation="p.undo2", timeout=2, retry=1,
             compensation_retry=1, late_reply="ignore", depends_on=("s1",)),
    )  # fmt: skip
    d = Driver(defn, saga_id="7d1c0b4e-5f1a-4c2e-9a3b-2d6f8e0a1b2c")
    d.start()
    d.apply(OperatorAction(OperatorVerb.RETRY_STEP, "ana", "test", step="s0"))
    d.succeed("s1")
    d.tick(3.0)
    assert d.state.steps["s1"].status is StepStatus.COMPENSATING
    s0 = d.state.steps["s0"]
    d.apply(DeadLettered(MessageKind.COMMAND, "s0", s0.command_id, "m-x", "rejected", 1))
    d.apply(OperatorAction(OperatorVerb.COMPENSATE, "ana", "test"))
    assert d.state.steps["s2"].status is StepStatus.COMPENSATING
    before = d.state
    decision = d.tick(3.0)
    check(defn, before, decision)
    assert ("s1", MessageKind.COMPENSATION) not in {(c.step, c.kind) for c in decision.commands}
    assert any(h.event == "compensation_deferred" for h in decision.history)
    d.compensated("s2")
    again = d.tick(10.0)
    assert ("s1", MessageKind.COMPENSATION) in {(c.step, c.kind) for c in again.commands}
