"""Time in the decider: re-sends, giving up, late replies, compensation timeouts, deadlines."""

from __future__ import annotations

from saga_tasks.core.definitions import saga, step
from saga_tasks.core.states import Classification, MessageKind, Outcome, SagaStatus, StepStatus
from tests.unit.sagas import Driver


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
