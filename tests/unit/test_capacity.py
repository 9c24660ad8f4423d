"""``core.capacity``, the rule of flow control's places, by example (the stateful world in
``test_flow_stateful`` drives it through every order of events)."""

from __future__ import annotations

from dataclasses import replace

from saga_tasks.core import capacity
from saga_tasks.core.definitions import step
from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.core.states import SagaStatus
from tests.unit.sagas import Driver, linear

QUEUE = "p.commands"


def messages_of(decision):
    return [
        OutboundMessage(c.message_id, c.task_name, c.queue, {H_STEP: c.step}, {}, c.saga_id)
        for c in decision.commands
    ]


def test_an_answer_gives_the_place_back_whatever_the_limits():
    driver = Driver(linear(2))
    driver.start()
    before = driver.state
    decision = driver.apply(driver.reply("s0"))
    for limited in ({QUEUE}, set()):
        staged = capacity.stage(
            limited, driver.definition, old=before, new=decision.state,
            messages=messages_of(decision),
        )  # fmt: skip
        assert staged.freed == ("s0",), limited
    assert capacity.stage(set(), driver.definition, old=before, new=decision.state,
                          messages=messages_of(decision)).held == ()  # fmt: skip


def test_a_step_a_migration_adds_waits_as_a_first_command():
    driver = Driver(linear(1))
    driver.start()
    before = driver.state
    added = step("audit", "p.audit", queue=QUEUE)
    moved = replace(before, steps={**before.steps, "audit": before.steps["s0"]})
    message = OutboundMessage("m-audit", "p.audit", QUEUE, {H_STEP: "audit"}, {}, before.saga_id)
    staged = capacity.stage({QUEUE}, replace(driver.definition, steps=(*driver.definition.steps,
                            added)), old=before, new=moved, messages=[message])  # fmt: skip
    assert staged.held == (message,) and staged.touched == {QUEUE}


def test_a_replay_takes_a_place_only_in_a_running_or_compensating_saga():
    driver = Driver(linear(1))
    driver.start()
    state = driver.state
    assert capacity.takes_place({QUEUE}, QUEUE, state, "s0")
    assert not capacity.takes_place(set(), QUEUE, state, "s0"), "no limit, no place"
    ended = replace(state, status=SagaStatus.COMPLETED)
    assert not capacity.takes_place({QUEUE}, QUEUE, ended, "s0")


def test_a_late_answer_that_reopens_an_ended_saga_takes_back_the_places_still_out():
    """Found by the flow world on parallel steps: an operator resolves a saga in review
    while one step's command is out (its place is given back with the end), then another
    step's late answer reopens the saga into review. The command still out held no place,
    so a person sending the saga on let the queue take one more than its limit."""
    driver = Driver(linear(2))
    driver.start()
    running = driver.state
    ended = replace(running, status=SagaStatus.COMPLETED)
    assert "s0" in capacity.stage({QUEUE}, driver.definition, old=running, new=ended,
                                  messages=[]).freed  # fmt: skip
    reopened = replace(ended, status=SagaStatus.MANUAL_REVIEW)
    for limited in ({QUEUE}, set()):
        staged = capacity.stage(limited, driver.definition, old=ended, new=reopened, messages=[])
        assert staged.retaken == ("s0",), limited
    review = replace(running, status=SagaStatus.MANUAL_REVIEW)
    assert capacity.stage({QUEUE}, driver.definition, old=running, new=review,
                          messages=[]).retaken == (), "a saga that never ended keeps its rows"  # fmt: skip
