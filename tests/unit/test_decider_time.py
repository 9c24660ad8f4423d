"""Time in the decider: re-sends, giving up, late replies, compensation timeouts, deadlines."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from saga_tasks.core.definitions import RetryPolicy, saga, step
from saga_tasks.core.events import DeadlinePassed
from saga_tasks.core.states import Classification, MessageKind, Outcome, SagaStatus, StepStatus
from tests.unit.sagas import Driver, linear


def order_like(late_reply: str = "compensate", *, last_compensable: bool = True):
    return saga(
        "t",
        step(
            "a",
            "p.a",
            compensation="p.ua",
            queue="p.commands",
            timeout=10,
            retry=3,
            compensation_retry=2,
        ),
        step(
            "b",
            "p.b",
            compensation="p.ub" if last_compensable else None,
            queue="p.commands",
            timeout=10,
            retry=2,
            compensation_retry=2,
            late_reply=late_reply,
        ),
        timeout=600,
    )


def kinds(decision):
    return [(c.step, c.kind, c.attempt) for c in decision.commands]


def test_a_quiet_sweep_changes_nothing():
    d = Driver(order_like())
    d.start()
    decision = d.tick(5)
    assert not decision.changed and decision.history == () and decision.commands == ()


def test_no_answer_resends_the_same_command():
    d = Driver(order_like())
    first = d.start().commands[0]
    decision = d.tick(11)
    (again,) = decision.commands
    assert (again.step, again.kind, again.attempt) == ("a", MessageKind.COMMAND, 2)
    assert again.command_id == first.command_id
    assert again.message_id != first.message_id
    # The second attempt waits twice the timeout (the backoff), less up to a quarter.
    waits = d.state.steps["a"].deadline - d.now
    assert timedelta(seconds=15) <= waits <= timedelta(seconds=20)
    assert decision.history[0].event == "step_resent"
    # The answer to either send counts.
    d.succeed("a")
    assert d.state.steps["a"].status is StepStatus.SUCCEEDED


def test_spent_retries_give_up_and_compensate_the_step_itself():
    d = Driver(order_like())
    d.start()
    d.succeed("a")
    d.lapse()  # b attempt 2
    decision = d.lapse()  # b gives up
    assert d.state.status is SagaStatus.COMPENSATING
    assert "had no answer after its attempts" in d.state.reason
    st = d.state.steps["b"]
    assert st.given_up and st.status is StepStatus.COMPENSATING
    # Only b's compensation: a waits until b is settled (children before parents).
    assert kinds(decision) == [("b", MessageKind.COMPENSATION, 1)]
    assert decision.commands[0].compensates == st.command_id
    decision = d.compensated("b")
    assert kinds(decision) == [("a", MessageKind.COMPENSATION, 1)]
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED


def test_late_success_after_giving_up_is_written_down_and_changes_nothing():
    d = Driver(order_like())
    d.start()
    d.succeed("a")
    late = d.reply("b")
    d.lapse()
    d.lapse()
    before = d.state
    decision = d.apply(late)
    assert decision.classification is Classification.LATE
    assert not decision.changed and decision.state == before
    assert decision.history[0].event == "late_reply"
    assert "undoes it" in decision.history[0].reason
    # The tombstone answer (a failure) is late too, never a conflict.
    decision = d.apply(d.reply("b", Outcome.FAILURE, code="compensated_before_execution"))
    assert decision.classification is Classification.LATE
    assert d.state.status is SagaStatus.COMPENSATING


def test_ignore_policy_leaves_the_step_timed_out_and_compensates_the_rest():
    d = Driver(order_like("ignore"))
    d.start()
    d.succeed("a")
    d.lapse()
    decision = d.lapse()
    assert d.state.steps["b"].status is StepStatus.TIMED_OUT
    assert kinds(decision) == [("a", MessageKind.COMPENSATION, 1)]
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED
    decision = d.succeed("b")
    assert decision.classification is Classification.LATE
    assert "ignored" in decision.history[0].reason
    assert d.state.status is SagaStatus.COMPENSATED


def test_manual_review_policy_hands_a_late_success_to_a_person():
    d = Driver(order_like("manual_review"))
    d.start()
    d.succeed("a")
    d.lapse()
    d.lapse()
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED
    decision = d.succeed("b")
    assert decision.classification is Classification.LATE
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "succeeded after it was given up" in d.state.reason


def test_a_step_that_cannot_be_undone_is_sent_again_until_it_answers():
    """Forward recovery: silence is no reason to hand a step that cannot be undone to a
    person. It is sent again, further and further apart up to the policy's cap, with one
    alert once its attempts are spent, and its answer moves the saga on."""
    d = Driver(order_like(last_compensable=False))
    d.start()
    d.succeed("a")
    events = []
    for _ in range(8):
        decision = d.lapse()
        events += [h.event for h in decision.history]
        assert kinds(decision)[-1][:2] == ("b", MessageKind.COMMAND)
    assert d.state.status is SagaStatus.RUNNING and d.state.steps["b"].attempt == 9
    assert events.count("step_overdue") == 1
    # The waits grow to the cap (ten times the timeout) and stay there.
    assert d.state.steps["b"].deadline - d.now <= timedelta(seconds=100)
    assert d.state.steps["b"].deadline - d.now >= timedelta(seconds=75)
    d.succeed("b")
    assert d.state.status is SagaStatus.COMPLETED


def test_the_sagas_deadline_does_not_undo_the_rest_while_a_step_that_cannot_be_undone_runs():
    d = Driver(order_like(last_compensable=False))
    d.start()
    d.succeed("a")
    decision = d.tick(601)
    assert d.state.status is SagaStatus.RUNNING and d.state.deadline is None
    assert decision.history[0].event == "deadline_passed_forward"
    assert kinds(decision) == [("b", MessageKind.COMMAND, 2)]
    d.fail("b")  # its refusal: nothing of it to undo; the rest is compensated
    assert d.state.status is SagaStatus.COMPENSATING
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED


def test_an_unanswered_compensation_is_sent_again_until_it_answers():
    d = Driver(order_like())
    d.start()
    d.succeed("a")
    d.fail("b")
    first = d.decisions[-1].commands[0]
    decision = d.lapse()
    assert kinds(decision) == [("a", MessageKind.COMPENSATION, 2)]
    assert decision.commands[0].command_id == first.command_id
    decision = d.lapse()
    assert kinds(decision) == [("a", MessageKind.COMPENSATION, 3)]
    assert "compensation_overdue" in [h.event for h in decision.history]
    assert d.state.status is SagaStatus.COMPENSATING
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED


def test_saga_deadline_gives_up_what_is_in_flight_and_compensates():
    d = Driver(
        saga(
            "t", step("a", "p.a", compensation="p.ua", queue="q", timeout=100, retry=5), timeout=30
        )
    )
    d.start()
    decision = d.tick(31)
    assert d.state.status is SagaStatus.COMPENSATING
    assert d.state.reason == "the saga's deadline passed"
    assert d.state.steps["a"].given_up
    assert kinds(decision) == [("a", MessageKind.COMPENSATION, 1)]


def test_a_success_that_beats_the_sweep_wins():
    d = Driver(order_like())
    d.start()
    d.now = d.state.steps["a"].deadline  # the deadline is due ...
    d.succeed("a")  # ... but the reply got the lock first
    decision = d.tick(0)
    assert decision.commands == () or all(c.step == "b" for c in decision.commands)
    assert d.state.steps["a"].attempt == 1


def test_a_step_queued_behind_a_backlog_waits_on_instead_of_being_sent_again():
    """Silence explained by a backlog in the step's queue: no copy is sent (it would double
    the queue's work), no attempt is spent, the deadline moves on by the step's timeout,
    and the history says why. Once the queue is empty, the silence is the participant's
    again and the command is sent again as before."""
    d = Driver(linear(2))
    d.start()
    waited = d.tick(31, backlog={"p.commands": 120})
    st = d.state.steps["s0"]
    assert not waited.commands and st.status is StepStatus.REQUESTED and st.attempt == 1
    assert st.deadline == d.now + timedelta(seconds=30)
    assert [h.event for h in waited.history] == ["resend_deferred"]
    assert "120 messages wait in p.commands or for the orchestrator" in waited.history[0].reason
    resent = d.tick(31, backlog={"p.commands": 0, "other.commands": 9})
    assert [c.attempt for c in resent.commands] == [2]
    assert d.state.steps["s0"].attempt == 2


def test_a_backlog_spends_no_attempt_but_the_sagas_own_deadline_still_holds():
    """Slow under load is no reason to give up a step: past its last attempt, a step whose
    queue is backed up still waits. The saga's own deadline is the bound: past it the
    step is given up and the rest compensated, backlog or not."""
    d = Driver(linear(2))
    d.start()
    for _ in range(2):
        d.lapse()  # attempts 2 and 3 sent
    assert d.state.steps["s0"].attempt == 3
    d.lapse(backlog={"p.commands": 5})
    assert d.state.status is SagaStatus.RUNNING
    assert d.state.steps["s0"].status is StepStatus.REQUESTED
    d.tick(600, backlog={"p.commands": 5})  # the saga's own deadline (10 minutes) passed
    # Given up (its outcome unknown) and compensated at once, as any step past its bound.
    assert d.state.steps["s0"].given_up
    assert d.state.status is SagaStatus.COMPENSATING


def test_a_compensation_queued_behind_a_backlog_waits_on_too():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    assert d.state.steps["s0"].status is StepStatus.COMPENSATING
    waited = d.tick(31, backlog={"p.commands": 3})
    assert not waited.commands and d.state.steps["s0"].compensation_attempt == 1
    assert [h.event for h in waited.history] == ["resend_deferred"]
    assert [c.kind for c in d.tick(31).commands] == [MessageKind.COMPENSATION]


def test_patience_with_a_backlog_is_bounded():
    """A queue that never drains (no consumer at all) must still end in a decision: after
    BACKLOG_PATIENCE timeouts since the command was last sent, it is sent again."""
    from saga_tasks.core.decider.deadlines import BACKLOG_PATIENCE

    d = Driver(linear(1))
    d.start()
    deferred = 0
    while not (sent := d.tick(31, backlog={"p.commands": 50})).commands:
        deferred += 1
        assert deferred < 100
    assert deferred == BACKLOG_PATIENCE - 1
    assert [c.attempt for c in sent.commands] == [2]


def test_a_command_waiting_for_capacity_spends_no_attempt_and_its_deadline_runs_from_dispatch():
    """Flow control holds a command in PostgreSQL until its queue has room: the silence
    is the orchestrator's own, so nothing is sent again; once the command has left, the
    step waits its full timeout from then, not from when the saga decided to send it."""
    d = Driver(linear(1))
    d.start()
    waited = d.lapse(dispatch={"s0": None})
    st = d.state.steps["s0"]
    assert not waited.commands and st.attempt == 1 and st.status is StepStatus.REQUESTED
    assert [h.event for h in waited.history] == ["dispatch_waiting"]
    # Deferred as long again as it has waited (30.5 s so far, more than the timeout).
    assert st.deadline == d.now + (d.now - st.requested_at)
    again = d.lapse(dispatch={"s0": None})
    assert [h.event for h in again.history] == ["dispatch_waiting"]
    assert d.state.steps["s0"].deadline - d.now > timedelta(seconds=60), "the looks thin out"
    sent_at = d.state.next_wake_at() - timedelta(seconds=10)  # sent 10 s before the look
    moved = d.lapse(dispatch={"s0": sent_at})
    assert not moved.commands and [h.event for h in moved.history] == ["deadline_from_dispatch"]
    assert d.state.steps["s0"].deadline == sent_at + timedelta(seconds=30)
    resent = d.lapse(dispatch={"s0": sent_at})
    assert [c.attempt for c in resent.commands] == [2]


def test_the_sagas_own_deadline_holds_for_a_command_waiting_for_capacity():
    d = Driver(linear(1, timeout=60))
    d.start()
    d.lapse(dispatch={"s0": None})
    d.apply(DeadlinePassed(dispatch={"s0": None}), step=60)
    assert d.state.status is SagaStatus.COMPENSATING and d.state.steps["s0"].given_up


@given(
    timeout=st.floats(min_value=0.1, max_value=3600),
    attempt=st.integers(min_value=1, max_value=10_000),
    backoff=st.floats(min_value=1, max_value=10),
    jitter=st.floats(min_value=0, max_value=0.99),
    cap=st.one_of(st.none(), st.floats(min_value=0.01, max_value=86_400)),
)
def test_an_attempts_wait_is_never_shorter_than_the_timeout_nor_longer_than_the_cap(
    timeout, attempt, backoff, jitter, cap
):
    t = timedelta(seconds=timeout)
    limit = timedelta(seconds=cap) if cap is not None else None
    policy = RetryPolicy(backoff=backoff, jitter=jitter, max_interval=limit)
    wait = policy.wait(t, attempt, "k")
    assert t <= wait <= max(limit or t * 10, t) + timedelta(microseconds=1)


def test_an_attempts_wait_grows_to_its_cap_and_stays_within_its_jitter():
    policy = RetryPolicy(backoff=2.0, jitter=0.25, max_interval=timedelta(seconds=100))
    t = timedelta(seconds=10)
    assert policy.wait(t, 1, "c") == t
    for attempt, full in [(2, 20), (3, 40), (4, 80), (5, 100), (9, 100)]:
        wait = policy.wait(t, attempt, "c").total_seconds()
        assert 0.75 * full <= wait <= full, (attempt, wait)
        assert wait == policy.wait(t, attempt, "c").total_seconds(), "deterministic"
    spread = {policy.wait(t, 3, f"c{i}") for i in range(50)}
    assert len(spread) > 40, "sagas silenced together are not sent again together"
