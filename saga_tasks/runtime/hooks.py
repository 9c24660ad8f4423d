"""Points on the runtime's path where an app may step in: how the example injects its
demo faults (crashes, slow work, duplicates, refusals) without a flag in the shells.

The defaults do nothing. A probe is asked for once per message and, when returned,
called at each point of that message's path; every point may raise (or kill the
process) to show what the recovery paths do from there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sqlalchemy import Engine

from saga_tasks.core.clock import Clock
from saga_tasks.core.messages import Command, OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.runtime.outlet import AfterPublish


class CommandProbe(Protocol):
    """One command's path through its participant's runtime (first executions only are
    probed past ``received``: a duplicate runs nothing)."""

    def received(self) -> None:
        """Before anything: may raise (a retry, an unknown error) or kill the worker."""

    def begun(self) -> None:
        """The transaction is open, nothing claimed: may raise ``BusinessRejection``."""

    def claimed(self) -> None:
        """The command is claimed in the ledger; the business function runs next."""

    def before_commit(self) -> None:
        """The reply is written, the transaction not yet committed."""

    def committed(self) -> None:
        """Committed; the reply is not yet published."""

    def sent(self, reply: OutboundMessage, publisher: Publisher) -> None:
        """The reply was handed to the outlet."""


class ReplyProbe(Protocol):
    """One accepted reply's path through the orchestrator (first deliveries only)."""

    def committed(self) -> None:
        """The decision is committed; its commands are not yet published."""

    def sent(self, flush: Callable[[float], bool]) -> None:
        """The commands were handed to the outlet (``flush`` waits for the broker)."""


class Hooks:
    """No hooks: the production path."""

    def starting(self, saga_type: str, payload: Mapping[str, Any]) -> None:
        """Before a saga starts: raise ``InvalidPayload`` to refuse it."""
        return

    def command(
        self, task_name: str, command: Command, *, fresh: bool, retries: int,
        fields: Mapping[str, Any],
    ) -> CommandProbe | None:  # fmt: skip
        """A probe for this command, or None. ``fresh``: its first delivery of its first
        attempt; ``retries``: how many retries brought it here; ``fields``: its log fields."""
        return None

    def reply(self, state: SagaState, step: str, fields: Mapping[str, Any]) -> ReplyProbe | None:
        """A probe for the first delivery of an accepted reply, or None."""
        return None

    def relay(self, engine: Engine, clock: Clock) -> AfterPublish | None:
        """What runs between an outbox recovery's publish and its mark, or None."""
        return None


NO_HOOKS = Hooks()
