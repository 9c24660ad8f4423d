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

from saga_tasks import ReplyReceived, SagaState
from saga_tasks.core.decider import Decision
from saga_tasks.core.definitions import SagaDefinition, saga, step
from saga_tasks.core.states import (
    IN_FLIGHT,
    TERMINAL_SAGA,
    Classification,
    MessageKind,
    Outcome,
    SagaStatus,
    StepStatus,
)
from tests.unit.sagas import Driver


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


def check(
    defn: SagaDefinition, before: SagaState, decision: Decision, *, operator: bool = False
) -> None:
    after = decision.state
    assert decision.history or not decision.changed, "every change is explained in the history"
    if decision.changed:
        assert after.version == before.version + 1
    else:
        assert after == before
        assert decision.commands == ()

    sent = {(c.step, c.kind) for c in decision.commands}
    assert len(sent) == len(decision.commands), "one command per step and kind at most"
    for name in defn.by_name:
        old, new = before.steps[name], after.steps[name]
        entered_request = new.status is StepStatus.REQUESTED and (
            old.status is not StepStatus.REQUESTED
            or new.attempt != old.attempt
            or new.command_id != old.command_id
        )
        entered_compensation = new.status is StepStatus.COMPENSATING and (
            old.status is not StepStatus.COMPENSATING
            or new.compensation_attempt != old.compensation_attempt
            or new.compensation_id != old.compensation_id
        )
        entered_fence = new.fencing and (
            not old.fencing or new.compensation_attempt != old.compensation_attempt
        )
        # A replayed held message is itself what is in flight again: nothing new is sent.
        replayed = any(h.event == "replay_awaited" and h.step == name for h in decision.history)
        # Invariant 1: the state says "requested" exactly when a command is sent for it.
        assert (entered_request and not replayed) == ((name, MessageKind.COMMAND) in sent)
        assert ((entered_compensation or entered_fence) and not replayed) == (
            (name, MessageKind.COMPENSATION) in sent
        )

    for c in decision.commands:
        st_ = after.steps[c.step]
        if c.kind is MessageKind.COMMAND:
            assert after.status is SagaStatus.RUNNING
            assert c.command_id == st_.command_id
            assert all(after.steps[p].status is StepStatus.SUCCEEDED for p in defn.parents[c.step])
        elif st_.fencing:  # a step done by hand: its command in flight is fenced
            assert operator or c.attempt > 1
            assert c.compensates == st_.command_id
            assert st_.compensation_id is None, "a later compensation gets an id of its own"
        else:
            assert after.status is SagaStatus.COMPENSATING
            assert c.command_id == st_.compensation_id
            assert c.compensates == st_.command_id
            assert c.command_id not in c.supersedes
            assert defn.step(c.step).compensable
            for child in defn.descendants(c.step):
                assert after.steps[child].status not in (
                    StepStatus.SUCCEEDED,
                    StepStatus.REQUESTED,
                    StepStatus.COMPENSATING,
                ), "children are undone before their parents"

    # A person's word is final; a final status was checked when it was reached.
    resolved = (
        any(h.event == "saga_resolved" for h in decision.history) or before.status == after.status
    )
    if after.status is SagaStatus.COMPLETED and not resolved:
        assert all(s.status is StepStatus.SUCCEEDED for s in after.steps.values())
    if after.status is SagaStatus.COMPENSATED and not resolved:
        for s in after.steps.values():
            assert s.status not in (StepStatus.SUCCEEDED, *IN_FLIGHT)
    if after.status is SagaStatus.MANUAL_REVIEW:
        assert after.reason
    # No dead end: an active saga waits for an answer (or a fence), so a reply or a
    # deadline moves it again; the decider's own last resort never has to act.
    if after.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
        assert any(s.in_flight for s in after.steps.values()), "active with nothing in flight"
        assert after.next_wake_at() is not None
    assert all(h.event != "no_way_forward" for h in decision.history), decision.history
    if after.status in TERMINAL_SAGA:
        assert after.finished_at is not None
        assert after.next_wake_at() is None
    if before.status is SagaStatus.MANUAL_REVIEW and not operator:
        assert after.status is SagaStatus.MANUAL_REVIEW, (
            "only an operator takes a saga out of review"
        )
    if before.status in TERMINAL_SAGA and after.status != before.status:
        assert after.status is SagaStatus.MANUAL_REVIEW
        assert decision.classification in (Classification.CONFLICTING, Classification.LATE)


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
