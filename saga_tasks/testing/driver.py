"""A saga definition driven through the pure decider, no services: what a test of the
saga's logic (its order of steps, compensations, timeouts, branches) needs.

    d = SagaDriver(TRIP)
    d.start()                       # the first commands
    d.succeed("book_hotel")         # its reply
    d.fail("book_flight", "sold_out")
    assert d.state.status is SagaStatus.COMPENSATING
    assert [c.step for c in d.sent] == ["book_hotel"]     # its compensation

Each call feeds the decider one event the way the orchestrator does (the latest state, a
clock that moves on a little), keeps the state it returns, and returns the ``Decision``
(its ``commands``, ``history`` and ``classification``). Ids are derived from a fixed key,
so a test sees the same command ids on every run; ``events`` keeps what was fed, when, for
a golden history (``saga_tasks.testing.golden``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from saga_tasks.core.decider import CommandIntent, Decision, decide
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.events import DeadlinePassed, ReplyReceived, SignalReceived, Started
from saga_tasks.core.model import SagaState
from saga_tasks.core.states import MessageKind, Outcome

START = datetime(2026, 1, 1, tzinfo=UTC)
"""Where a driver's clock starts unless told otherwise."""

Event = Started | ReplyReceived | DeadlinePassed | SignalReceived
_DRIVER_IDS = uuid.UUID("0b8e6a52-52a3-4c1e-9d0c-5a6a3f0d1e70")
"""Namespace of a driver's saga ids: one per type and business key, the same every run."""


class SagaDriver:
    """Feeds events for one saga to the decider, keeping its latest state."""

    def __init__(
        self,
        definition: SagaDefinition,
        *,
        payload: Mapping[str, Any] | None = None,
        saga_id: str | None = None,
        business_key: str = "test-1",
        now: datetime = START,
        id_key: str = "5a" * 16,
    ) -> None:
        self.definition = definition
        self.now = now
        self.initial = SagaState.new(
            definition,
            saga_id=saga_id
            or str(uuid.uuid5(_DRIVER_IDS, f"{definition.saga_type}/{business_key}")),
            business_key=business_key,
            payload=dict(payload) if payload is not None else {},
            now=now,
            id_key=id_key,
        )
        self.state = self.initial
        self.events: list[tuple[datetime, Event]] = []
        """Each event fed to the decider and the time it was decided at."""
        self.decisions: list[Decision] = []
        self._replies = 0

    @property
    def sent(self) -> Sequence[CommandIntent]:
        """The commands and compensations the last decision sends."""
        return self.decisions[-1].commands if self.decisions else ()

    def apply(self, event: Event, *, step: float = 0.01) -> Decision:
        """Move the clock ``step`` seconds on, then decide ``event`` on the latest state."""
        self.now += timedelta(seconds=step)
        decision = decide(self.definition, self.state, event, self.now)
        self.events.append((self.now, event))
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
        result: Mapping[str, Any] | None = None,
    ) -> ReplyReceived:
        """The reply a participant would send to the step's command (or compensation, with
        ``kind``) now awaited, not yet applied: apply it, or apply it twice."""
        st = self.state.steps[step_name]
        awaited = st.command_id if kind is MessageKind.COMMAND else st.compensation_id
        self._replies += 1
        if result is None:
            result = {"r": step_name} if outcome is Outcome.SUCCESS else None
        return ReplyReceived(
            step=step_name,
            kind=kind,
            command_id=command_id or awaited or str(uuid.uuid4()),
            outcome=outcome,
            message_id=f"m{self._replies}",
            result=dict(result) if result is not None else None,
            error_code=code or (None if outcome is Outcome.SUCCESS else "refused"),
        )

    def succeed(self, step_name: str, result: Mapping[str, Any] | None = None) -> Decision:
        """The step's command succeeded (with ``result``, what later steps read)."""
        return self.apply(self.reply(step_name, result=result))

    def fail(self, step_name: str, code: str = "refused") -> Decision:
        """The step's command was refused (a ``BusinessRejection`` with ``code``)."""
        return self.apply(self.reply(step_name, Outcome.FAILURE, code=code))

    def compensated(self, step_name: str, outcome: Outcome = Outcome.SUCCESS) -> Decision:
        """The step's compensation answered."""
        return self.apply(self.reply(step_name, outcome, kind=MessageKind.COMPENSATION))

    def signal(
        self, step_name: str, data: Mapping[str, Any], *, actor: str = "tester", reason: str = ""
    ) -> Decision:
        """A person's signal to a step that waits for one."""
        return self.apply(
            SignalReceived(step_name, dict(data), actor=actor, reason=reason or "test")
        )

    def tick(self, seconds: float, backlog: Mapping[str, int] | None = None) -> Decision:
        """Let ``seconds`` pass, then run the sweeper's event (``backlog``: messages waiting
        in each queue, as the sweeper saw them)."""
        return self.apply(DeadlinePassed(dict(backlog or {})), step=seconds)

    def lapse(
        self,
        backlog: Mapping[str, int] | None = None,
        dispatch: Mapping[str, datetime | None] | None = None,
    ) -> Decision:
        """Let time pass just beyond the saga's next deadline, then run the sweeper's
        event: what a participant that never answers looks like."""
        wake = self.state.next_wake_at()
        if wake is None:
            raise ValueError("nothing is awaited: the saga has no deadline to pass")
        seconds = max((wake - self.now).total_seconds(), 0) + 0.5
        return self.apply(DeadlinePassed(dict(backlog or {}), dict(dispatch or {})), step=seconds)
