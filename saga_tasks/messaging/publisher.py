"""The only code that sends to RabbitMQ: outbox messages as Celery task messages.

Every publish waits for the broker's confirm and is ``mandatory``, so a missing
exchange, an unroutable key or a nack is an error of *this* publish, never a
silent loss or a surprise on the next one. Failures become ``PublishFailed``; the
outbox row stays unpublished and recovery sends it later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from amqp import Message
from amqp.exceptions import AMQPError
from celery import Celery
from celery.utils.nodenames import anon_nodename
from kombu.exceptions import KombuError
from kombu.utils.json import dumps

from saga_tasks.core.messages import OutboundMessage, describe
from saga_tasks.errors import PublishFailed
from saga_tasks.messaging.topology import Topology
from saga_tasks.messaging.users import broker_user
from saga_tasks.urls import mask_url

log = logging.getLogger("saga_tasks.publisher")


@dataclass(frozen=True)
class PublishResult:
    published: tuple[str, ...]
    failed: tuple[str, ...]
    error: PublishFailed | None = None


class Publisher:
    """Sends outbox messages through a Celery app's producer pool."""

    def __init__(self, app: Celery, topology: Topology, confirm_timeout: float) -> None:
        self.app = app
        self.topology = topology
        self.confirm_timeout = confirm_timeout

    def publish(self, messages: Sequence[OutboundMessage]) -> PublishResult:
        """Publish in order; stop at the first failure and report what went out."""
        if not messages:
            return PublishResult((), ())

        published: list[str] = []
        try:
            with self.app.producer_or_acquire() as producer:
                for message in messages:
                    self._send(producer, message)
                    published.append(message.message_id)
        except (TimeoutError, AMQPError, KombuError, OSError) as exc:
            failed = tuple(m.message_id for m in messages[len(published) :])
            first = messages[len(published)]
            detail = str(exc) or type(exc).__name__
            log.warning(
                "publish failed; the outbox keeps the message for recovery",
                extra={
                    "saga_id": first.saga_id,
                    "message_id": first.message_id,
                    "error": detail,
                    "unpublished": len(failed),
                },
            )
            error = PublishFailed("RabbitMQ", mask_url(self.app.conf.broker_url or ""), detail)
            return PublishResult(tuple(published), failed, error)
        return PublishResult(tuple(published), ())

    def publish_raw(
        self,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: dict[str, Any],
        content_type: str | None,
        content_encoding: str | None,
    ) -> None:
        """Publish bytes as they are (a parked or replayed message); raises ``PublishFailed``."""
        try:
            with self.app.producer_or_acquire() as producer:
                producer.publish(
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    headers=headers,
                    content_type=content_type or "application/octet-stream",
                    content_encoding=content_encoding or "binary",
                    delivery_mode=2,
                    mandatory=True,
                    # Who sends it (RabbitMQ checks it against the connection's user).
                    user_id=broker_user(str(self.app.conf.broker_url)),
                    retry=True,
                    retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2},
                    confirm_timeout=self.confirm_timeout,
                )
        except (AMQPError, KombuError, OSError) as exc:
            raise PublishFailed(
                "RabbitMQ", mask_url(self.app.conf.broker_url or ""), str(exc) or type(exc).__name__
            ) from exc

    def _send(self, producer: Any, message: OutboundMessage) -> None:
        queue = self.topology.queue(message.queue)
        self.app.send_task(
            message.task_name,
            kwargs=dict(message.body),
            # Given, so Celery does not repr the body (costly, and it would show it).
            argsrepr="()",
            kwargsrepr=describe(message),
            task_id=message.message_id,
            headers=dict(message.headers),
            queue=cast(Any, queue),  # a Queue object: its declared arguments travel with it
            exchange=queue.exchange.name,
            routing_key=message.routing_key
            or self.topology.routing_key(message.queue, message.task_name),
            producer=producer,
            ignore_result=True,  # saga state lives in PostgreSQL, never in the result backend
            mandatory=True,
            confirm_timeout=self.confirm_timeout,
            retry=True,
            retry_policy={
                "max_retries": 2,
                "interval_start": 0,
                "interval_step": 0.2,
                "interval_max": 1,
            },
        )


def task_message_encoder(
    app: Celery, topology: Topology
) -> Callable[[OutboundMessage], tuple[str, str, Any]]:
    """Outbox messages as the bytes and properties ``send_task`` would publish: a
    Celery protocol 2 task message, JSON, persistent, the task id as correlation id,
    the app's ``user_id`` when it sets one. For the dispatcher, which publishes on a
    connection of its own (to the same broker URL, so as the same user)."""
    as_task = app.amqp.as_task_v2
    origin = anon_nodename()

    def encode(message: OutboundMessage) -> tuple[str, str, Any]:
        queue = topology.queue(message.queue)
        headers, properties, body, _sent = as_task(
            message.message_id,
            message.task_name,
            kwargs=dict(message.body),
            argsrepr="()",
            kwargsrepr=describe(message),  # references only; no repr of the body
            origin=origin,
            ignore_result=True,  # saga state lives in PostgreSQL, never in the result backend
        )
        headers.update(message.headers)
        routing_key = message.routing_key or topology.routing_key(message.queue, message.task_name)
        signed = {"user_id": properties["user_id"]} if properties.get("user_id") else {}
        amqp_message = Message(
            dumps(body).encode(),
            content_type="application/json",
            content_encoding="utf-8",
            application_headers=headers,
            delivery_mode=2,
            correlation_id=message.message_id,
            reply_to="",
            **signed,
        )
        return queue.exchange.name, routing_key, amqp_message

    return encode
