"""Definitions and a tiny driver for the decider tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from saga_tasks.core.decider import Decision
from saga_tasks.core.definitions import SagaDefinition, saga, step
from saga_tasks.core.states import (
    IN_FLIGHT,
    TERMINAL_SAGA,
    Classification,
    MessageKind,
    SagaStatus,
    StepStatus,
)
from saga_tasks.testing import SagaDriver, SagaState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def linear(
    n: int = 4, *, compensable: Iterable[bool] | None = None, timeout: float = 600
) -> SagaDefinition:
    flags = list(compensable) if compensable is not None else [True] * n
    return saga(
        "linear",
        *(
            step(
                f"s{i}",
                f"p.do{i}",
                compensation=f"p.undo{i}" if flags[i] else None,
                queue="p.commands",
            )
            for i in range(n)
        ),
        timeout=timeout,
    )


def diamond() -> SagaDefinition:
    """a -> (b, c) -> d."""
    return saga(
        "diamond",
        step("a", "p.a", compensation="p.ua", queue="p.commands"),
        step("b", "p.b", compensation="p.ub", queue="p.commands", depends_on=["a"]),
        step("c", "q.c", compensation="q.uc", queue="q.commands", depends_on=["a"]),
        step("d", "p.d", compensation="p.ud", queue="p.commands", depends_on=["b", "c"]),
    )


class Driver(SagaDriver):
    """The shipped driver (``saga_tasks.testing.SagaDriver``) with these tests' defaults."""

    def __init__(
        self,
        definition: SagaDefinition,
        saga_id: str | None = None,
        payload: dict[str, object] | None = None,
    ) -> None:
        super().__init__(
            definition,
            saga_id=saga_id,
            payload=payload if payload is not None else {"x": 1},
            business_key="k",
            now=T0,
        )

    def signal(self, step_name: str, data: dict[str, object]) -> Decision:  # type: ignore[override]
        return super().signal(step_name, data, actor="ann", reason="inspected")


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
        # Invariant 1: the state says "requested" exactly when a command is sent for it
        # (a human step sends none: it waits for a person's signal).
        human = defn.step(name).human is not None
        assert (entered_request and not replayed and not human) == (
            (name, MessageKind.COMMAND) in sent
        )
        # A step not taken is never sent, nor undone.
        if new.not_taken:
            assert (name, MessageKind.COMMAND) not in sent
            assert (name, MessageKind.COMPENSATION) not in sent
        assert ((entered_compensation or entered_fence) and not replayed) == (
            (name, MessageKind.COMPENSATION) in sent
        )

    for c in decision.commands:
        st_ = after.steps[c.step]
        if c.kind is MessageKind.COMMAND:
            # Forward only while the saga goes forward, but for a step that cannot be
            # undone: once sent, it is sent again until it answers (forward recovery).
            resent = before.steps[c.step].status is StepStatus.REQUESTED
            assert after.status is SagaStatus.RUNNING or (
                resent and not defn.step(c.step).compensable
            )
            assert c.command_id == st_.command_id
            assert all(
                after.steps[p].status is StepStatus.SUCCEEDED or after.steps[p].not_taken
                for p in defn.parents[c.step]
            )
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
        assert all(s.status is StepStatus.SUCCEEDED or s.not_taken for s in after.steps.values())
    if after.status is SagaStatus.COMPENSATED and not resolved:
        for s in after.steps.values():
            assert s.status not in (StepStatus.SUCCEEDED, *IN_FLIGHT)
    if after.status is SagaStatus.MANUAL_REVIEW:
        assert after.reason
    # No dead end: an active saga waits for an answer (or a fence), so a reply or a
    # deadline moves it again; the decider's own last resort never has to act.
    if after.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
        assert any(s.pending for s in after.steps.values()), "active with nothing in flight"
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
