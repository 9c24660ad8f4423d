"""Who may send what: the broker user behind a message, as RabbitMQ validated it.

RabbitMQ compares the AMQP ``user_id`` property of every publish with the user of the
connection and refuses a publish that names another user; a publish without one is not
checked. So a message's ``user_id`` says which credential sent it, and a message without
one says nothing. With one RabbitMQ user per service (``SAGA_BROKER_USER_PREFIX``), a
message about work on a participant's queue is believed only from two users:

| message                                | believed from                                      |
|----------------------------------------|----------------------------------------------------|
| a reply about a step                   | the step's participant; the orchestrator (its own  |
|                                        | retry copies, outbox recovery, operator replays)   |
| a command on a participant's queue     | the orchestrator; the participant itself (its own  |
|                                        | retry copies and resends)                          |
| a held message, to move its saga       | the orchestrator (a command the broker dead-       |
|                                        | lettered keeps its publisher's user); the step's   |
|                                        | participant (its own holds)                        |

Anything else (no ``user_id``, another participant, a user no service has) is refused:
recorded, counted, parked, and it changes nothing. Without a prefix every process shares
one user and nothing is checked: the broker is then no trust boundary (development).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from saga_tasks.errors import ConfigurationError

ORCHESTRATOR_ROLE = "orchestrator"
"""The orchestrator's user is ``<prefix>orchestrator``; no participant may take the name."""
H_SENT_BY = "saga_sent_by"
"""On a copy a service makes of a message it consumed (a retry or outage copy, a hold, a
Celery re-send): the broker user that sent the original, empty for none. The copy is
published as the service itself, so without this the service would vouch, on the copy's
return, for a message it had not yet judged."""


@dataclass(frozen=True)
class Senders:
    """The service users of one deployment and whom each message kind is believed from."""

    prefix: str = ""
    """``SAGA_BROKER_USER_PREFIX``; empty: one user for every process, nothing checked."""
    participants: Mapping[str, str] = field(default_factory=dict)
    """The participant consuming each command queue, by queue name."""

    _users: Mapping[str, str | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.enforced and ORCHESTRATOR_ROLE in self.participants.values():
            raise ConfigurationError(
                f"a participant named {ORCHESTRATOR_ROLE!r} would share the orchestrator's "
                "broker user; rename it"
            )
        users: dict[str, str | None] = {self.orchestrator: None}
        for queue in sorted(self.participants):
            users[f"{self.prefix}{self.participants[queue]}"] = queue
        object.__setattr__(self, "_users", users)

    @property
    def enforced(self) -> bool:
        return bool(self.prefix)

    @property
    def orchestrator(self) -> str:
        return f"{self.prefix}{ORCHESTRATOR_ROLE}"

    def user_of(self, queue: str | None) -> str | None:
        """The broker user of the participant consuming ``queue``; None if none does."""
        name = self.participants.get(queue or "")
        return None if name is None else f"{self.prefix}{name}"

    def users(self) -> dict[str, str | None]:
        """Every service user and the command queue it consumes (None: the orchestrator)."""
        return dict(self._users)

    def stranger(self, sender: str | None, what: str) -> str | None:
        """Why ``what`` is refused before anything else is known of it: it names no sender,
        or one that is no service of this deployment; None otherwise."""
        if not self.enforced or (sender and sender in self._users):
            return None
        if not sender:
            return f"{what} names no sender (no AMQP user_id): not authenticated"
        return f"{what} from broker user {sender!r}, which is no service of this deployment"

    def refusal(self, sender: str | None, queue: str | None, what: str) -> str | None:
        """Why ``what`` (a message about work on ``queue``) is not believed from ``sender``,
        the AMQP ``user_id`` it arrived with; None when it is (or nothing is checked)."""
        if not self.enforced or sender == self.orchestrator:
            return None
        first = self.stranger(sender, what)
        if first is not None:
            return first
        owner = self.user_of(queue)
        if owner is None:
            return f"{what} from broker user {sender!r} is about a queue no participant owns"
        if sender == owner:
            return None
        return (
            f"{what} from broker user {sender!r}; only {owner!r} or {self.orchestrator!r} "
            "may send it"
        )


OPEN = Senders()
"""No prefix: one broker user for every process, nothing checked."""


def sender_of(user_id: str | None, headers: Mapping[str, Any] | None, own: str) -> str | None:
    """Who a delivery comes from: its ``user_id``, or, for a copy this service made itself
    (``user_id`` is ``own``, the user it publishes as), the sender of the original the copy
    names. Only a service's own copies are read so: another user cannot relay for anyone."""
    if user_id and user_id == own and headers is not None and H_SENT_BY in headers:
        return str(headers[H_SENT_BY] or "") or None
    return user_id or None


def publisher(sender: str | None) -> str:
    """How a message's sender is named to people."""
    return f"broker user {sender!r}" if sender else "an unknown publisher (no AMQP user_id)"


__all__ = ["H_SENT_BY", "OPEN", "ORCHESTRATOR_ROLE", "Senders", "publisher", "sender_of"]
