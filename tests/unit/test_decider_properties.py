"""Properties of the decider over random DAG sagas and random interleavings of replies.

The invariants are those of the design guide that the decider alone can break:
a requested step always has a command, children are undone before parents, a
final status means what it says, manual review has a reason, and every decision
is explained by at least one history entry.
"""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga_tasks.core.definitions import SagaDefinition, saga, step
from saga_tasks.core.states import (
    IN_FLIGHT,
    MessageKind,
    Outcome,
    SagaStatus,
    StepStatus,
)
from saga_tasks.testing import ReplyReceived
from tests.unit.sagas import Driver, check


@st.composite
def definitions(draw: st.DrawFn) -> SagaDefinition:
    n = draw(st.integers(min_value=1, max_value=6))
    steps = []
    for i in range(n):
        parents = (
            draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=3)) if i else set()
        )
        steps.append(
            step(
                f"s{i}",
                f"p.do{i}",
                compensation=f"p.undo{i}" if draw(st.booleans()) else None,
                queue=f"q{i % 2}.commands",
                depends_on=[f"s{p}" for p in sorted(parents)],
            )
        )
    return saga("random", *steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(defn=definitions(), data=st.data())
def test_invariants_hold_under_any_interleaving(defn: SagaDefinition, data: st.DataObject) -> None:
    d = Driver(defn)
    initial = d.state
    check(defn, initial, d.start())
    sent: list[ReplyReceived] = []
    for _ in range(data.draw(st.integers(min_value=0, max_value=25))):
        in_flight = [n for n, s in d.state.steps.items() if s.status in IN_FLIGHT]
        settled = [n for n, s in d.state.steps.items() if s.command_id is not None]
        choice = data.draw(
            st.sampled_from(["answer", "answer", "duplicate", "conflict", "garbage"])
        )
        if choice == "answer" and in_flight:
            name = data.draw(st.sampled_from(in_flight))
            kind = (
                MessageKind.COMMAND
                if d.state.steps[name].status is StepStatus.REQUESTED
                else MessageKind.COMPENSATION
            )
            outcome = data.draw(st.sampled_from(list(Outcome)))
            event = d.reply(name, outcome, kind=kind)
        elif choice == "duplicate" and sent:
            event = data.draw(st.sampled_from(sent))
        elif choice == "conflict" and settled:
            name = data.draw(st.sampled_from(settled))
            event = d.reply(name, data.draw(st.sampled_from(list(Outcome))))
        else:
            event = ReplyReceived(
                step=data.draw(st.sampled_from([*defn.by_name, "ghost"])),
                kind=data.draw(st.sampled_from(list(MessageKind))),
                command_id=str(uuid.uuid4()),
                outcome=Outcome.SUCCESS,
                message_id="garbage",
            )
        before = d.state
        decision = d.apply(event)
        check(defn, before, decision)
        assert decision.history, "every reply leaves a history entry"
        sent.append(event)


@settings(max_examples=300, deadline=None)
@given(defn=definitions(), data=st.data())
def test_honest_answers_always_end_the_saga(defn: SagaDefinition, data: st.DataObject) -> None:
    """Answer every command once, in any order, with any outcome: the saga ends."""
    d = Driver(defn)
    d.start()
    for _ in range(4 * len(defn.steps) + 2):
        in_flight = [n for n, s in d.state.steps.items() if s.status in IN_FLIGHT]
        if not in_flight:
            break
        name = data.draw(st.sampled_from(in_flight))
        if d.state.steps[name].status is StepStatus.REQUESTED:
            outcome = data.draw(st.sampled_from(list(Outcome)))
            d.apply(d.reply(name, outcome))
        else:
            d.apply(d.reply(name, kind=MessageKind.COMPENSATION))
    assert d.state.status in (SagaStatus.COMPLETED, SagaStatus.COMPENSATED)
    failed = any(s.status is StepStatus.FAILED for s in d.state.steps.values())
    assert (d.state.status is SagaStatus.COMPENSATED) == failed


@settings(max_examples=200, deadline=None)
@given(defn=definitions())
def test_all_successes_complete_with_one_command_per_step(defn: SagaDefinition) -> None:
    d = Driver(defn)
    sent = list(d.start().commands)
    while True:
        in_flight = [n for n, s in d.state.steps.items() if s.status is StepStatus.REQUESTED]
        if not in_flight:
            break
        sent.extend(d.succeed(in_flight[0]).commands)
    assert d.state.status is SagaStatus.COMPLETED
    assert sorted(c.step for c in sent) == sorted(defn.by_name)
    assert all(c.kind is MessageKind.COMMAND for c in sent)
