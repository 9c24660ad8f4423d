"""Messages that leave the normal path: into the dead-letter or parking queue, with why.

The broker's ``saga.dead_letter`` and ``saga.parking_lot`` queues are transit, not
storage: the intake (``runtime.intake``) moves each message into ``saga.held_message``
and feeds a dead letter to its saga; operators replay or discard held messages
(``runtime.replay``). This module puts messages there and names the headers that say why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from saga_tasks.core.clock import Clock
from saga_tasks.core.messages import OutboundMessage
from saga_tasks.core.senders import H_SENT_BY
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.messaging.topology import (
    DEAD_LETTER_QUEUE,
    PARKING_EXCHANGE,
    PARKING_QUEUE,
)

DEAD_LETTER = "dead_letter"
PARKING = "parking"
HOLDINGS = {DEAD_LETTER: DEAD_LETTER_QUEUE, PARKING: PARKING_QUEUE}

H_DEAD_REASON = "saga_dead_reason"
H_DEAD_DEATHS = "saga_dead_deaths"
"""On a poison message we dead-letter ourselves: how many times its worker died on it."""
H_DEAD_FROM = "saga_dead_from"
H_PARKED_REASON = "saga_parked_reason"
H_PARKED_FROM = "saga_parked_from"
H_HELD_AT = "saga_held_at"
H_REPLAYED_FROM = "saga_replayed_from"
H_OUTAGE = "saga_outage"
"""Times a message was sent back for an outage of our database (``tasks.failures``):
picks its delay tier; never a retry, and dropped from any other copy of the message."""
H_STORED_ESCAPED = "saga_stored_escaped"
"""In a held message's stored headers: what was escaped (or reduced) to store it."""
_TRANSIENT = (
    H_DEAD_REASON,
    H_DEAD_DEATHS,
    H_DEAD_FROM,
    H_PARKED_REASON,
    H_PARKED_FROM,
    H_HELD_AT,
    H_OUTAGE,
    H_STORED_ESCAPED,
)


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The message's own headers: without the broker's x-death and our holding marks."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if not k.startswith("x-") and k not in _TRANSIENT and k != H_REPLAYED_FROM
    }


INT_MAX = 2**31 - 1
"""The largest count a held message's row stores."""
POISON = "poison: "
"""How a held message's reason starts when its worker died on it: only that blocks a replay."""


class Holding:
    """Sends a message that cannot be handled to the dead-letter or parking queue."""

    def __init__(self, *, publisher: Callable[[], Publisher], clock: Clock) -> None:
        self._publisher = publisher
        self.clock = clock

    def hold(
        self,
        message: OutboundMessage,
        *,
        holding: str,
        reason: str,
        from_queue: str,
        worker_deaths: int | None = None,
    ) -> None:
        """Send a task message to the dead-letter or parking queue with the reason attached.

        ``worker_deaths``: the message is poison, its worker died on it that many times
        (its reason then starts with ``poison:``, which is what blocks a replay).
        """
        marks: dict[str, Any] = {H_HELD_AT: self.clock.now().isoformat()}
        if holding == DEAD_LETTER:
            marks |= {H_DEAD_REASON: reason[:500], H_DEAD_FROM: from_queue}
            if worker_deaths is not None:
                marks[H_DEAD_DEATHS] = worker_deaths
            queue = DEAD_LETTER_QUEUE
        else:
            marks |= {H_PARKED_REASON: reason[:500], H_PARKED_FROM: from_queue}
            queue = PARKING_QUEUE
        held = OutboundMessage(
            message_id=message.message_id,
            task_name=message.task_name,
            queue=queue,
            headers={**clean_headers(message.headers), **marks},
            body=message.body,
            saga_id=message.saga_id,
            # The dead-letter exchange takes any key (it keeps the origin visible); parking one.
            routing_key=from_queue if holding == DEAD_LETTER else PARKING_QUEUE,
        )
        result = self._publisher().publish([held])
        if result.error is not None:
            raise result.error

    def park_raw(
        self,
        *,
        body: bytes,
        headers: Mapping[str, Any],
        content_type: str | None,
        content_encoding: str | None,
        reason: str,
        from_queue: str,
        sent_by: str | None = None,
    ) -> None:
        """Park bytes that could not even be read as a task message; ``sent_by``: the
        broker user that sent them (``core.senders.H_SENT_BY``), None for none."""
        marks = {
            H_PARKED_REASON: reason[:500],
            H_PARKED_FROM: from_queue,
            H_HELD_AT: self.clock.now().isoformat(),
            H_SENT_BY: sent_by or "",
        }
        self._publisher().publish_raw(
            exchange=PARKING_EXCHANGE.name,
            routing_key=PARKING_QUEUE,
            body=body,
            headers={**clean_headers(dict(headers)), **marks},
            content_type=content_type,
            content_encoding=content_encoding,
        )


def header_count(value: Any) -> int:
    """A count from a header: a whole number from 0 up; anything else is 0."""
    try:
        return min(max(int(value or 0), 0), INT_MAX)
    except (TypeError, ValueError, OverflowError):
        return 0
