"""The decider, path by path: every classification and every compensation order."""

from __future__ import annotations

from saga_tasks.core.states import Classification, MessageKind, Outcome, SagaStatus, StepStatus
from tests.unit.sagas import Driver, diamond, linear


def commands(decision) -> list[tuple[str, MessageKind]]:
    return [(c.step, c.kind) for c in decision.commands]


def test_start_sends_the_first_step_and_sets_the_deadline():
    d = Driver(linear(3))
    decision = d.start()
    assert decision.classification is Classification.ACCEPTED
    assert commands(decision) == [("s0", MessageKind.COMMAND)]
    assert d.state.version == 1
    assert d.state.deadline == d.now + d.definition.timeout
    assert d.state.steps["s0"].status is StepStatus.REQUESTED
    assert d.state.steps["s0"].attempt == 1
    assert [h.event for h in decision.history] == ["saga_started", "step_requested"]


def test_happy_path_runs_every_step_in_order_and_completes():
    d = Driver(linear(4))
    d.start()
    for i in range(4):
        decision = d.succeed(f"s{i}")
        expected = [(f"s{i + 1}", MessageKind.COMMAND)] if i < 3 else []
        assert commands(decision) == expected
    assert d.state.status is SagaStatus.COMPLETED
    assert d.state.finished_at is not None
    assert d.state.version == 5
    assert d.decisions[-1].history[-1].event == "saga_completed"


def test_later_steps_receive_earlier_results():
    d = Driver(linear(2))
    d.start()
    decision = d.apply(d.reply("s0", result={"order_id": "o-1"}))
    assert decision.commands[0].body["results"] == {"s0": {"order_id": "o-1"}}
    assert decision.commands[0].body["saga_payload"] == {"x": 1}


def test_failure_compensates_succeeded_steps_newest_first():
    d = Driver(linear(4))
    d.start()
    d.succeed("s0")
    d.succeed("s1")
    decision = d.fail("s2", "declined")
    assert d.state.status is SagaStatus.COMPENSATING
    assert d.state.reason == "step 's2' failed: declined"
    assert commands(decision) == [("s1", MessageKind.COMPENSATION)]
    assert d.state.steps["s3"].status is StepStatus.SKIPPED
    decision = d.compensated("s1")
    assert commands(decision) == [("s0", MessageKind.COMPENSATION)]
    decision = d.compensated("s0")
    assert commands(decision) == []
    assert d.state.status is SagaStatus.COMPENSATED
    assert d.state.steps["s2"].status is StepStatus.FAILED
    assert decision.history[-1].event == "saga_compensated"


def test_failure_of_the_first_step_compensates_nothing():
    d = Driver(linear(3))
    d.start()
    decision = d.fail("s0")
    assert commands(decision) == []
    assert d.state.status is SagaStatus.COMPENSATED


def test_compensation_carries_the_forward_command_id():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    decision = d.fail("s1")
    (comp,) = decision.commands
    assert comp.compensates == d.state.steps["s0"].command_id
    assert comp.command_id == d.state.steps["s0"].compensation_id
    assert comp.command_id != comp.compensates


def test_fan_out_and_fan_in():
    d = Driver(diamond())
    assert commands(d.start()) == [("a", MessageKind.COMMAND)]
    assert sorted(commands(d.succeed("a"))) == [
        ("b", MessageKind.COMMAND),
        ("c", MessageKind.COMMAND),
    ]
    assert commands(d.succeed("c")) == []  # d waits for b
    assert commands(d.succeed("b")) == [("d", MessageKind.COMMAND)]
    d.succeed("d")
    assert d.state.status is SagaStatus.COMPLETED


def test_in_flight_sibling_is_compensated_when_it_answers_and_parent_waits_for_it():
    d = Driver(diamond())
    d.start()
    d.succeed("a")
    decision = d.fail("b")
    # c is still in flight: a must wait, children before parents.
    assert commands(decision) == []
    assert d.state.status is SagaStatus.COMPENSATING
    decision = d.succeed("c")
    assert commands(decision) == [("c", MessageKind.COMPENSATION)]
    decision = d.compensated("c")
    assert commands(decision) == [("a", MessageKind.COMPENSATION)]
    d.compensated("a")
    assert d.state.status is SagaStatus.COMPENSATED
    assert d.state.steps["d"].status is StepStatus.SKIPPED


def test_in_flight_sibling_that_fails_needs_no_compensation():
    d = Driver(diamond())
    d.start()
    d.succeed("a")
    d.fail("b")
    decision = d.fail("c")
    assert commands(decision) == [("a", MessageKind.COMPENSATION)]


def test_step_without_compensation_stays_done_and_is_recorded():
    d = Driver(linear(3, compensable=[True, False, True]))
    d.start()
    d.succeed("s0")
    d.succeed("s1")
    decision = d.fail("s2")
    assert d.state.steps["s1"].status is StepStatus.COMPENSATION_SKIPPED
    assert any(h.event == "compensation_skipped" and h.step == "s1" for h in decision.history)
    assert commands(decision) == [("s0", MessageKind.COMPENSATION)]


def test_duplicate_reply_changes_nothing_but_is_written_down():
    d = Driver(linear(2))
    d.start()
    first = d.reply("s0")
    d.apply(first)
    before = d.state
    decision = d.apply(first)
    assert decision.classification is Classification.DUPLICATE
    assert not decision.changed
    assert decision.state is before
    assert decision.commands == ()
    assert [h.event for h in decision.history] == ["duplicate_reply"]


def test_success_then_failure_is_a_conflict_for_manual_review():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    decision = d.fail("s0")
    assert decision.classification is Classification.CONFLICTING
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "conflicting replies" in (d.state.reason or "")
    assert decision.commands == ()


def test_failure_then_success_is_a_conflict_too():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    d.compensated("s0")
    assert d.state.status is SagaStatus.COMPENSATED
    decision = d.succeed("s1")
    assert decision.classification is Classification.CONFLICTING
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.finished_at is None


def test_refused_compensation_needs_a_person():
    d = Driver(linear(2))
    d.start()
    d.succeed("s0")
    d.fail("s1")
    decision = d.compensated("s0", Outcome.FAILURE)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["s0"].status is StepStatus.COMPENSATION_FAILED
    assert "compensation of step 's0' was refused" in (d.state.reason or "")
    assert decision.commands == ()


def test_replies_in_manual_review_are_recorded_but_send_nothing():
    d = Driver(diamond())
    d.start()
    d.succeed("a")
    d.succeed("b")
    d.fail("b")  # conflict -> manual review while c is in flight
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    decision = d.succeed("c")
    assert decision.changed
    assert d.state.steps["c"].status is StepStatus.SUCCEEDED
    assert decision.commands == ()
    assert d.state.status is SagaStatus.MANUAL_REVIEW


def test_reply_for_an_unknown_step_is_invalid():
    d = Driver(linear(2))
    d.start()
    reply = d.reply("s0")
    decision = d.apply(reply.__class__(**{**reply.__dict__, "step": "nope"}))
    assert decision.classification is Classification.INVALID
    assert not decision.changed
    assert decision.history[0].event == "invalid_message"


def test_reply_for_a_command_never_sent_is_invalid():
    d = Driver(linear(2))
    d.start()
    decision = d.apply(d.reply("s0", command_id="00000000-0000-0000-0000-000000000000"))
    assert decision.classification is Classification.INVALID
    assert d.state.steps["s0"].status is StepStatus.REQUESTED
    decision = d.apply(d.reply("s1"))  # s1 was never requested
    assert decision.classification is Classification.INVALID


def test_start_twice_is_a_duplicate():
    d = Driver(linear(2))
    d.start()
    decision = d.start()
    assert decision.classification is Classification.DUPLICATE
    assert decision.commands == ()


def test_command_ids_are_stable_and_message_ids_unique():
    d1, d2 = Driver(linear(2)), Driver(linear(2))
    d2.state = d2.state.__class__(**{**d2.state.__dict__, "saga_id": d1.state.saga_id})
    c1, c2 = d1.start().commands[0], d2.start().commands[0]
    assert (c1.command_id, c1.message_id) == (c2.command_id, c2.message_id)
    assert c1.command_id != c1.message_id


def test_next_wake_at_is_the_earliest_deadline_while_active():
    d = Driver(linear(2))
    d.start()
    step_deadline = d.state.steps["s0"].deadline
    assert d.state.next_wake_at() == min(step_deadline, d.state.deadline)
    d.succeed("s0")
    d.succeed("s1")
    assert d.state.next_wake_at() is None
