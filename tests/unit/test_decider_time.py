"""Time in the decider: re-sends, giving up, late replies, compensation timeouts, deadlines."""

from __future__ import annotations

from datetime import timedelta

from saga_tasks.core.definitions import saga, step
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
    assert d.state.steps["a"].deadline == d.now + order_like().step("a").timeout
    assert decision.history[0].event == "step_resent"
    # The answer to either send counts.
    d.succeed("a")
    assert d.state.steps["a"].status is StepStatus.SUCCEEDED


def test_spent_retries_give_up_and_compensate_the_step_itself():
    d = Driver(order_like())
    d.start()
    d.succeed("a")
    d.tick(11)  # b attempt 2
    decision = d.tick(11)  # b gives up
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
    d.tick(11)
    d.tick(11)
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
    d.tick(11)
    decision = d.tick(11)
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
    d.tick(11)
    d.tick(11)
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED
    decision = d.succeed("b")
    assert decision.classification is Classification.LATE
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "succeeded after it was given up" in d.state.reason


def test_a_step_that_cannot_be_undone_and_never_answers_needs_a_person():
    d = Driver(order_like(last_compensable=False))
    d.start()
    d.succeed("a")
    d.tick(11)
    decision = d.tick(11)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "cannot be undone and its outcome is unknown" in d.state.reason
    assert decision.commands == ()


def test_unanswered_compensation_is_resent_then_needs_a_person():
    d = Driver(order_like())
    d.start()
    d.succeed("a")
    d.fail("b")
    first = d.decisions[-1].commands[0]
    decision = d.tick(11)
    assert kinds(decision) == [("a", MessageKind.COMPENSATION, 2)]
    assert decision.commands[0].command_id == first.command_id
    decision = d.tick(11)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["a"].status is StepStatus.COMPENSATION_FAILED
    assert [h.event for h in decision.history][:1] == ["compensation_exhausted"]


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


def test_a_compensation_answering_after_it_was_given_up_is_late():
    d = Driver(order_like())
    d.start()
    d.succeed("a")
    d.fail("b")
    d.tick(11)
    d.tick(11)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    decision = d.compensated("a")
    assert decision.classification is Classification.LATE
    assert "step is undone" in decision.history[0].reason
    assert d.state.status is SagaStatus.MANUAL_REVIEW


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
    assert "p.commands holds 120 messages waiting" in waited.history[0].reason
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
        d.tick(31)  # attempts 2 and 3 sent
    assert d.state.steps["s0"].attempt == 3
    d.tick(31, backlog={"p.commands": 5})
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
