"""Taking messages off a holding queue one at a time, acking each only once it is handled."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection

from saga_tasks.errors import ServiceUnavailable


@dataclass(frozen=True)
class RawMessage:
    """A message as the broker delivered it: headers, properties and bytes."""

    headers: Mapping[str, Any]
    content_type: str | None
    content_encoding: str | None
    body: bytes
    user_id: str | None = None
    """The broker user that published it, as RabbitMQ validated it; None if it set none."""
    properties: Mapping[str, Any] = field(default_factory=dict)
    """Every AMQP property as delivered (message id, timestamp, ...), headers aside."""
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False
    """RabbitMQ's flag: this message may have been delivered before (and not acked)."""


def take(
    broker_url: str,
    queue: str,
    handle: Callable[[RawMessage], bool | None],
    *,
    limit: int,
    acked: Callable[[], None] | None = None,
) -> int:
    """Hand up to ``limit`` messages of ``queue`` to ``handle``; ack each after it returns;
    the number acked.

    If ``handle`` returns False, that message is left: not acked, it goes back to the
    queue when this pass ends, and the next message is handed over. If ``handle``
    raises, that message is not acked (the broker keeps it) and the error propagates:
    nothing taken is ever lost.

    ``acked`` is called once the broker has processed every ack of the pass (it answered
    the channel's close, which it reads after them), also when ``handle`` raised; never
    when the channel did not close cleanly (an ack may or may not have arrived). It must
    not raise.
    """
    taken = tried = 0
    try:
        with Connection(broker_url, connect_timeout=5) as broker:
            channel: Any = broker.channel()
            try:
                while tried < limit:
                    tried += 1
                    message = channel.basic_get(queue=queue, no_ack=False)
                    if message is None:
                        break
                    properties = dict(getattr(message, "properties", {}) or {})
                    properties.pop("application_headers", None)
                    delivery = dict(getattr(message, "delivery_info", {}) or {})
                    body = message.body
                    handled = handle(
                        RawMessage(
                            headers=dict(message.headers or {}),
                            content_type=properties.get("content_type"),
                            content_encoding=properties.get("content_encoding"),
                            body=body if isinstance(body, bytes) else str(body).encode(),
                            user_id=_text(properties.get("user_id")),
                            properties=properties,
                            exchange=str(delivery.get("exchange") or ""),
                            routing_key=str(delivery.get("routing_key") or ""),
                            redelivered=bool(delivery.get("redelivered")),
                        )
                    )
                    if handled is False:
                        continue
                    channel.basic_ack(message.delivery_tag)
                    taken += 1
            finally:
                channel.close()
                if acked is not None:
                    acked()
    except OSError as exc:
        raise ServiceUnavailable("RabbitMQ", broker_url, exc) from exc
    return taken


def _text(value: Any) -> str | None:
    if not value:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
