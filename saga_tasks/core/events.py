"""The events that move a saga, as the decider sees them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from saga_tasks.core.states import MessageKind, Outcome


@dataclass(frozen=True)
class Started:
    """The saga row was just created; dispatch the root steps."""


@dataclass(frozen=True)
class ReplyReceived:
    """A participant answered a command or a compensation."""

    step: str
    kind: MessageKind
    """``COMMAND`` for the forward action, ``COMPENSATION`` for the undo."""
    command_id: str
    outcome: Outcome
    message_id: str
    result: Mapping[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None


@dataclass(frozen=True)
class DeadlinePassed:
    """The sweeper found a deadline of this saga due; the decider works out which."""

    backlog: Mapping[str, int] = field(default_factory=dict)
    """Messages waiting in each command queue as this sweep saw them: a command still
    queued behind them explains the silence, so it is not sent again (nor given up)."""
    dispatch: Mapping[str, datetime | None] = field(default_factory=dict)
    """Step -> when its latest command under flow control left for the broker, or None
    while it waits for capacity: a step's deadline runs from dispatch."""


@dataclass(frozen=True)
class DeadLettered:
    """A message of this saga reached the dead-letter queue; the intake recorded it."""

    kind: MessageKind
    """The dead message's kind: a command, a compensation or a reply."""
    step: str | None
    command_id: str | None
    """A dead command's or compensation's own id; for a dead reply, the id of the command
    it answers (a reply moves its saga only if that is the command the step awaits)."""
    message_id: str
    reason: str
    held_id: int


class OperatorVerb(StrEnum):
    RETRY_STEP = "retry_step"
    SKIP_STEP = "skip_step"
    COMPENSATE = "compensate"
    RESOLVE = "resolve"
    REPLAY = "replay"
    """A held message of this saga is published again; a saga in review resumes."""


@dataclass(frozen=True)
class OperatorAction:
    """A person acts on a saga; actor and reason go to the history."""

    verb: OperatorVerb
    actor: str
    reason: str
    step: str | None = None
    resolution: str | None = None
    """For ``resolve``: COMPLETED, COMPENSATED or FAILED."""
    message_kind: MessageKind | None = None
    """For ``replay``: the kind of the held message published again."""
    command_id: str | None = None
    """For ``replay``: the command (or compensation) id the held message carries."""


@dataclass(frozen=True)
class SignalReceived:
    """A person decided a human step; ``data`` was validated against the step's schema."""

    step: str
    data: Mapping[str, Any]
    actor: str
    reason: str


Event = Started | ReplyReceived | DeadlinePassed | DeadLettered | OperatorAction | SignalReceived
