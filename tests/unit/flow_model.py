"""``saga.saga_dispatch`` for one saga as a list of rows, written as the statements of
``persistence.dispatch`` write it, for the stateful worlds: ``write`` is the part of
``sagas.write_changes`` that holds, frees, withdraws and pauses; ``release`` is
``saga.dispatch_release`` for one queue without a rate; ``take_place`` is a replay's row.

What decides is production code (``core.capacity``); this is only the table it writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from saga_tasks.core.capacity import Staged
from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.core.states import ACTIVE_SAGA, SagaStatus

MOST_PER_RELEASE = 500


@dataclass
class Row:
    message: OutboundMessage
    paused: bool
    sent_at: datetime | None = None
    withdrawn: bool = False

    @property
    def step(self) -> str:
        return str(self.message.headers[H_STEP])

    @property
    def counted(self) -> bool:
        """In flight for the release: sent, its saga running or compensating."""
        return self.sent_at is not None and not self.paused

    @property
    def waiting(self) -> bool:
        return self.sent_at is None and not self.withdrawn


@dataclass
class DispatchTable:
    rows: list[Row] = field(default_factory=list)
    """In the order they were written (``created_at``)."""

    def out(self, steps: list[str]) -> set[str]:
        """``dispatch.out``: which of ``steps`` have a command sent and not yet answered."""
        return {r.step for r in self.rows if r.sent_at is not None and r.step in steps}

    def write(self, staged: Staged, status: SagaStatus, now: datetime) -> None:
        """One decision's statement: ``free_sql`` (delete the freed steps' sent rows,
        withdraw their and the superseded steps' waiting rows), ``pause_sql`` (the other
        live rows follow the saga's status) and ``insert_sql`` (the held commands, paused
        as the saga is); no part sees the rows another writes."""
        paused = status not in ACTIVE_SAGA
        freed, superseded = set(staged.freed), set(staged.superseded)
        kept = []
        for r in self.rows:
            if r.step in freed and r.sent_at is not None:
                continue  # its place is given back
            if r.waiting and r.step in freed | superseded:
                r.withdrawn = True
            elif not r.withdrawn and r.step not in freed:
                r.paused = paused
            kept.append(r)
        self.rows = kept + [Row(m, paused) for m in staged.held]
        for step in staged.retaken:  # ``FlowControl._retake``, before the statement's pause
            self.take_place(_placeholder(step), now)
            self.rows[-1].paused = paused

    def release(self, limit: int, now: datetime) -> list[OutboundMessage]:
        """``saga.dispatch_release`` for one queue: the oldest waiting rows of running or
        compensating sagas, as many as ``limit`` (0: no limit) leaves room for."""
        room = max(limit - sum(r.counted for r in self.rows), 0) if limit else MOST_PER_RELEASE
        picked = [r for r in self.rows if r.waiting and not r.paused][:room]
        for r in picked:
            r.sent_at = now
        return [r.message for r in picked]

    def take_place(self, message: OutboundMessage, now: datetime) -> None:
        """``dispatch.take_place``: a replay's row, sent now, unless a sent copy of its step
        holds the place already; a copy of the step waiting is withdrawn."""
        step = message.headers[H_STEP]
        for r in self.rows:
            if r.step == step and r.waiting and r.message.message_id != message.message_id:
                r.withdrawn = True
        if any(r.step == step and r.sent_at is not None for r in self.rows):
            return
        self.rows.append(Row(message, paused=False, sent_at=now))

    def dispatch_times(self) -> dict[str, datetime | None]:
        """``dispatch.dispatch_times``: step -> when its latest live command left (None:
        it waits)."""
        found: dict[str, datetime | None] = {}
        for r in self.rows:
            if not r.withdrawn:
                found[r.step] = r.sent_at
        return found


def _placeholder(step: str) -> OutboundMessage:
    """The sent row ``FlowControl._retake`` writes for ``step``: only its step counts."""
    return OutboundMessage(
        message_id=f"retaken/{step}", task_name="", queue="", headers={H_STEP: step}, body={},
        saga_id="",
    )  # fmt: skip
