"""A dead reply moves its saga only when it answers the command its step awaits now:
the saga's id is public, its command ids are not."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from saga_tasks.core.events import DeadLettered
from saga_tasks.core.states import MessageKind, Outcome, SagaStatus
from tests.unit.sagas import Driver, linear


def dead_reply(step: str, command_id: str | None) -> DeadLettered:
    return DeadLettered(MessageKind.REPLY, step, command_id, "dead-reply", "rejected", 7)


def test_a_dead_reply_to_the_awaited_command_sends_the_saga_to_review():
    d = Driver(linear(2))
    d.start()
    decision = d.apply(dead_reply("s0", d.state.steps["s0"].command_id))
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "a reply of step 's0' could not be applied" in (d.state.reason or "")
    assert decision.changed


def test_a_dead_reply_while_compensating_names_the_compensation():
    d = Driver(linear(2))
    d.start()
    d.apply(d.reply("s0"))
    d.apply(d.reply("s1", Outcome.FAILURE))
    compensation = d.state.steps["s0"].compensation_id
    assert d.state.status is SagaStatus.COMPENSATING and compensation
    d.apply(dead_reply("s0", d.state.steps["s0"].command_id))  # the forward one: long done
    assert d.state.status is SagaStatus.COMPENSATING
    d.apply(dead_reply("s0", compensation))
    assert d.state.status is SagaStatus.MANUAL_REVIEW


@given(
    replies=st.lists(st.sampled_from(["s0", "s1", "s2"]), max_size=3),
    step=st.sampled_from(["s0", "s1", "s2"]),
    named=st.sampled_from(["none", "made_up", "an_earlier_command"]),
)
def test_a_dead_reply_naming_no_awaited_command_moves_nothing(replies, step, named):
    d = Driver(linear(3))
    d.start()
    earlier = {}
    for name in replies:
        if d.state.steps[name].command_id and d.state.status is SagaStatus.RUNNING:
            earlier[name] = d.state.steps[name].command_id
            d.apply(d.reply(name))
    command_id = {
        "none": None,
        "made_up": str(uuid.uuid4()),
        "an_earlier_command": earlier.get(step, str(uuid.uuid4())),
    }[named]
    if command_id == d.state.steps[step].command_id and d.state.steps[step].in_flight:
        return  # that one is awaited: the case above
    before = d.state
    decision = d.apply(dead_reply(step, command_id))
    assert (d.state.status, d.state.version) == (before.status, before.version)
    assert not decision.changed and not decision.commands
    assert [h.event for h in decision.history] == ["dead_letter_recorded"]
