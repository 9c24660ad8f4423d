"""Definitions and a tiny driver for the decider tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from saga_tasks import ReplyReceived, SagaState, Started, decide
from saga_tasks.core.decider import Decision
from saga_tasks.core.definitions import SagaDefinition, saga, step
from saga_tasks.core.events import DeadlinePassed
from saga_tasks.core.states import MessageKind, Outcome

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def linear(n: int = 4, *, compensable: Iterable[bool] | None = None) -> SagaDefinition:
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


class Driver:
    """Feeds events to the decider the way the shell does, keeping the latest state."""

    def __init__(self, definition: SagaDefinition) -> None:
        self.definition = definition
        self.now = T0
        self.state = SagaState.new(
            definition,
            saga_id=str(uuid.uuid4()),
            business_key="k",
            payload={"x": 1},
            now=self.now,
        )
        self.decisions: list[Decision] = []
        self._counter = 0

    def apply(
        self, event: Started | ReplyReceived | DeadlinePassed, *, step: float = 0.01
    ) -> Decision:
        self.now += timedelta(seconds=step)
        decision = decide(self.definition, self.state, event, self.now)
        self.decisions.append(decision)
        self.state = decision.state
        return decision

    def start(self) -> Decision:
        return self.apply(Started())

    def reply(
        self,
        step_name: str,
        outcome: Outcome = Outcome.SUCCESS,
        *,
        kind: MessageKind = MessageKind.COMMAND,
        command_id: str | None = None,
        code: str | None = None,
        result: dict[str, object] | None = None,
    ) -> ReplyReceived:
        st = self.state.steps[step_name]
        cid = command_id or (st.command_id if kind is MessageKind.COMMAND else st.compensation_id)
        self._counter += 1
        return ReplyReceived(
            step=step_name,
            kind=kind,
            command_id=cid or str(uuid.uuid4()),
            outcome=outcome,
            message_id=f"m{self._counter}",
            result=result
            if result is not None
            else ({"r": step_name} if outcome is Outcome.SUCCESS else None),
            error_code=code or (None if outcome is Outcome.SUCCESS else "refused"),
        )

    def tick(self, seconds: float) -> Decision:
        """Let ``seconds`` pass, then run the sweeper's event."""
        return self.apply(DeadlinePassed(), step=seconds)

    def succeed(self, step_name: str) -> Decision:
        return self.apply(self.reply(step_name))

    def fail(self, step_name: str, code: str = "refused") -> Decision:
        return self.apply(self.reply(step_name, Outcome.FAILURE, code=code))

    def compensated(self, step_name: str, outcome: Outcome = Outcome.SUCCESS) -> Decision:
        return self.apply(self.reply(step_name, outcome, kind=MessageKind.COMPENSATION))
