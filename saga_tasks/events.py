"""The events that move a saga, as the decider sees them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from saga_tasks.states import MessageKind, Outcome


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


Event = Started | ReplyReceived | DeadlinePassed
