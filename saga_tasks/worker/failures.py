"""What a worker does with a message it could not handle: one policy, by failure type.

| failure                                   | what happens                                        |
|-------------------------------------------|-----------------------------------------------------|
| ``TransientError``, a lost race           | delayed retry through the TTL retry queues, one     |
|                                           | tier per retry (``saga_retry`` header counts them); |
|                                           | tiers spent: dead-letter queue                      |
| our database away (``ServiceUnavailable``:| a copy back to its queue through a delay tier, as   |
| refused, lost, lock or statement timeout) | long as it lasts; never counted as a retry, a       |
|                                           | redelivery or a quorum delivery (see ``_outage``)   |
| ``BusinessRejection``                     | a failure reply (in the participant runtime)        |
| a message that makes no sense             | recorded, then parked with its reason               |
| any other exception                       | ``SAGA_UNKNOWN_ERROR_RETRIES`` retries, then the    |
|                                           | dead-letter queue                                   |
| the worker died handling it, again and    | dead-lettered after ``SAGA_POISON_LIMIT``           |
| again (SIGKILL, segfault, OOM)            | redeliveries (counted only for redeliveries, so the |
|                                           | normal path writes nothing); a prefork child lost   |
|                                           | is re-sent at most ``max_retries`` times by Celery  |

A retry is a copy of the message published to ``<queue>.retry.<n>s`` (confirmed),
after which the original is acked: no countdown is ever held in a worker's memory.
Dead-lettering and parking publish a copy with the reason in its headers, then ack;
the intake moves it into the database and tells its saga. Every copy names the broker
user that sent the original (``saga_sent_by``): the copy goes out as this worker's own
user, and must not come back vouched for by it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery.exceptions import Ignore, Reject
from sqlalchemy import Engine, Table

from saga_tasks.core.messages import H_SAGA_ID, OutboundMessage
from saga_tasks.core.senders import H_SENT_BY, sender_of
from saga_tasks.errors import InvalidMessage, PublishFailed, SagaTasksError, ServiceUnavailable
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.messaging.topology import retry_queue
from saga_tasks.observability import metrics
from saga_tasks.persistence import redeliveries
from saga_tasks.persistence.db import translated
from saga_tasks.runtime.holding import (
    DEAD_LETTER,
    H_OUTAGE,
    PARKING,
    POISON,
    Holding,
    clean_headers,
)

log = logging.getLogger("saga_tasks.failures")

H_RETRY = "saga_retry"


class Parked(Exception):
    """Raised by a task body to park its message: it makes no sense here."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def user_id(request: Any) -> str | None:
    """The AMQP ``user_id`` a delivery carries (RabbitMQ validated it at publish)."""
    value = (getattr(request, "properties", None) or {}).get("user_id")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value) if value else None


def _fields(request: Any) -> dict[str, Any]:
    return {"saga_id": (request.headers or {}).get(H_SAGA_ID), "message_id": request.id}


def _header_count(request: Any, header: str) -> int:
    """A count we put in a header; anything else there (or nothing) reads as 0."""
    try:
        return max(int((request.headers or {}).get(header) or 0), 0)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class Counter:
    """Where a consumer counts redeliveries: its own database's redelivery table."""

    engine: Callable[[], Engine]
    table: Table


@dataclass(frozen=True)
class FailurePolicy:
    """The failure table above, with what it needs: the database of each queue's consumer
    (redelivery counts), the broker (retry copies) and the holding queues."""

    counters: Callable[[str], Counter]
    publisher: Callable[[], Publisher]
    holding: Holding
    retry_delays: Sequence[int]
    unknown_error_retries: int
    poison_limit: int
    user: str = ""
    """The broker user this process publishes as: a delivery from it is its own copy."""

    def sender(self, request: Any) -> str | None:
        """Who the delivery comes from (``core.senders.sender_of``)."""
        return sender_of(user_id(request), request.headers, self.user)

    def _message(
        self, request: Any, queue: str, extra: dict[str, Any] | None = None
    ) -> OutboundMessage:
        """A copy of the delivery for ``queue``, naming who sent the original."""
        headers = clean_headers(request.headers or {})
        headers.update(extra or {})
        headers[H_SENT_BY] = self.sender(request) or ""
        return OutboundMessage(
            message_id=request.id,
            task_name=request.task,
            queue=queue,
            headers=headers,
            body=dict(request.kwargs or {}),
            saga_id=headers.get(H_SAGA_ID),
        )

    @contextmanager
    def guard(self, request: Any, queue: str) -> Iterator[None]:
        """Run a task body under the failure table above."""
        delivery = request.delivery_info or {}
        if delivery.get("redelivered"):
            try:
                count = self._count_redelivery(queue, request.id)
            except ServiceUnavailable as exc:
                self._outage(request, queue, exc)
                raise Ignore() from exc  # acked: the copy sent back is what remains
            if count > self.poison_limit:
                reason = f"{POISON}redelivered {count} times, its worker died each time"
                log.error("dead-lettering a poison message: %s", reason, extra=_fields(request))
                self.holding.hold(
                    self._message(request, queue),
                    holding=DEAD_LETTER,
                    reason=reason,
                    from_queue=queue,
                    worker_deaths=count,
                )
                raise Ignore()  # acked: the copy in the dead-letter queue is what remains
        try:
            yield
        except (Parked, InvalidMessage) as parked:
            self.holding.hold(
                self._message(request, queue),
                holding=PARKING,
                reason=parked.reason,
                from_queue=queue,
            )
            log.warning("message parked: %s", parked.reason, extra=_fields(request))
        except ServiceUnavailable as exc:
            self._outage(request, queue, exc)
        except Exception as exc:  # noqa: BLE001 - every failure has a row in the table above
            self._retry_or_dead_letter(request, queue, exc)

    def _retry_or_dead_letter(self, request: Any, queue: str, exc: Exception) -> None:
        retries = _header_count(request, H_RETRY)
        retryable = isinstance(exc, SagaTasksError) and exc.retryable
        limit = len(self.retry_delays) if retryable else self.unknown_error_retries
        what = (
            f"{type(exc).__name__}: {exc}"
            if isinstance(exc, SagaTasksError)
            else type(exc).__name__
        )
        if retries < limit:
            delay = self.retry_delays[min(retries, len(self.retry_delays) - 1)]
            error = self._send_back(request, queue, delay=delay, extra={H_RETRY: retries + 1})
            if error is not None:
                raise Reject(str(error), requeue=True) from exc
            log.warning(
                "retry %d of %d in %d s after %s",
                retries + 1,
                limit,
                delay,
                what,
                extra=_fields(request),
            )
            return
        reason = f"retries exhausted ({retries}) after {what}"
        log.error("dead-lettering: %s", reason, extra=_fields(request))
        self.holding.hold(
            self._message(request, queue), holding=DEAD_LETTER, reason=reason, from_queue=queue
        )

    def _count_redelivery(self, consumer: str, message_id: str) -> int:
        counter = self.counters(consumer)
        engine = counter.engine()
        with translated(engine.url), engine.begin() as conn:
            return redeliveries.count(conn, consumer, message_id, counter.table)

    def _send_back(
        self, request: Any, queue: str, *, delay: int, extra: dict[str, Any]
    ) -> PublishFailed | None:
        """Publish a copy of the message to ``queue``'s retry tier of ``delay`` seconds
        (confirmed), back in ``queue`` after the delay; the caller then acks the original.
        The broker's error if it refused the copy: only then is the original handed back
        to it (``Reject(requeue=True)``), as nothing else can keep it."""
        target = retry_queue(queue, delay)
        copy = self._message(request, target, extra)
        result = self.publisher().publish(
            [OutboundMessage(**{**copy.__dict__, "routing_key": target})]
        )
        if result.error is not None:
            log.error("could not send the message back: %s", result.error, extra=_fields(request))
        return result.error

    def _outage(self, request: Any, queue: str, exc: ServiceUnavailable) -> None:
        """Our database is away (refused, lost, or a lock or statement timeout): send a copy
        of the message back through a delay tier and ack the original.

        An outage is nobody's message's fault, so it must spend none of the message's
        budgets. Handing the message back to the broker would: ``basic.reject``/``nack``
        with requeue sets ``redelivered`` (our poison counter counts that) and, on a quorum
        queue, counts toward ``x-delivery-limit`` (RabbitMQ 3.10 counts every return:
        requeue and a closed channel alike), so a few pauses dead-letter it. Keeping the
        message unacked in the worker until the database answers is no way out either: a
        long outage outlasts ``consumer_timeout`` (or, with the solo pool, the heartbeat)
        and the broker takes the message back, counted. A copy published with
        confirmation is a new delivery: not redelivered, delivery count 0, our retry count
        (``saga_retry``) unchanged. The delay grows with each outage hop (``saga_outage``)
        up to the last tier, so a long outage costs one delivery a tier, not a hot loop.
        If the worker dies between the confirm and the ack, the consumer's inbox or
        ledger takes the duplicate, as for any retry.
        """
        hops = _header_count(request, H_OUTAGE)
        delays = self.retry_delays
        delay = delays[min(hops, len(delays) - 1)]
        error = self._send_back(request, queue, delay=delay, extra={H_OUTAGE: hops + 1})
        if error is not None:
            raise Reject(str(error), requeue=True) from exc
        metrics.MESSAGES.labels(consumer=queue, classification="outage_deferred").inc()
        log.warning(
            "%s; the message comes back in %d s "
            "(outage hop %d; not counted as a retry or a delivery)",
            exc,
            delay,
            hops + 1,
            extra=_fields(request),
        )


__all__ = ["H_OUTAGE", "H_RETRY", "Counter", "FailurePolicy", "Parked", "user_id"]
