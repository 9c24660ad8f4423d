"""What a decision is made of: the new state, the commands to send and the history entries
that explain the change, as frozen values the shell writes and sends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from saga_tasks.core.model import SagaState
from saga_tasks.core.states import Classification, MessageKind, SagaStatus, StepStatus


@dataclass(frozen=True)
class CommandIntent:
    """A command or compensation to send once the decision is committed."""

    saga_id: str
    step: str
    kind: MessageKind
    task_name: str
    queue: str
    command_id: str
    message_id: str
    attempt: int
    body: Mapping[str, Any]
    compensates: str | None = None
    """For a compensation: the id of the forward command it undoes."""
    supersedes: tuple[str, ...] = ()
    """For a compensation: the ids earlier generations of it had. The participant fences
    them (a tombstone) and, if one of them already undid the command, runs nothing."""


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a saga's history: what happened and why."""

    event: str
    saga_status_before: SagaStatus | None
    saga_status_after: SagaStatus
    step: str | None = None
    step_status_before: StepStatus | None = None
    step_status_after: StepStatus | None = None
    message_id: str | None = None
    reason: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What ``decide`` returns; ``changed`` is False when only history is written."""

    state: SagaState
    commands: tuple[CommandIntent, ...]
    history: tuple[HistoryEntry, ...]
    classification: Classification
    changed: bool
