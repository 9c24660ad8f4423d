"""The worker's consumer, with every "this message makes no sense" path recorded.

Celery logs and acks an undecodable body, and rejects a message with no task name
or an unknown one; none of that reaches our tasks. Here each of those is written
to ``saga.invalid_message`` with its reason (on a participant's queue: counted and
logged only, its database holds no saga tables), parked as it arrived
(bytes and headers, with the reason) and then acked, so the worker keeps running
and an operator can see and replay what arrived. A message that cannot be parked is
rejected into the dead-letter queue instead of being dropped; once parked it is acked
even if the record cannot be written (the parked copy is what remains; a second copy
in the dead-letter queue would be a duplicate).

Protocol 2 defers decoding to the pool; the body is decoded once here first so an
unparseable one is caught before it becomes an anonymous task failure, and so the task
gate (``core.gate``) can judge the delivery before Celery runs anything: a task that does
not belong on its queue, or a message asking for follow-up work (a chain, callbacks, a
group), is parked the same way with the reason, counted (``saga_task_refused_total``)
and never run. The queue is the one the delivery's consumer tag consumes.

Acks are written at once (``call_soon_ack``). Celery hands them to the event loop's
ready set, and kombu's loop runs callbacks that *its own* ready callbacks scheduled
only after the next poll returns: with ``acks_late`` and the prefetch window full,
the broker sends nothing until it sees an ack, so the poll waits for the next timer
(up to a second) with every ack unsent (celery/celery#7718, kombu PR #1587). Measured
here: a solo worker on the reply queue sat idle 54% of a burst with 1,169 replies
ready. Acking immediately is what the loop would do next anyway, without the wait.
Celery before 5.7 sends acks through ``call_soon`` and never calls ``call_soon_ack``:
acks there are as correct and as slow as Celery makes them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.worker.consumer import Consumer

from saga_tasks.errors import ServiceUnavailable
from saga_tasks.observability import metrics
from saga_tasks.persistence import storable
from saga_tasks.runtime import invalid
from saga_tasks.worker.batching import batch_sizes, batchers, in_process_pool

log = logging.getLogger("saga_tasks.consumer")


class ImmediateAckConsumer(Consumer):
    """Celery's consumer with acks written at once; usable by any Celery app
    (``worker_consumer="saga_tasks.worker.consumer:ImmediateAckConsumer"``)."""

    def call_soon_ack(self, p: Any, *args: Any, **kwargs: Any) -> Any:
        """Ack (or reject) now when on the event loop's thread; see the module docstring."""
        hub = getattr(self, "hub", None)
        if hub is None or threading.get_ident() != getattr(hub, "_loop_thread", None):
            # Celery before 5.7 has no call_soon_ack (its acks go through call_soon, the
            # loop's slower path, which is correct): defer the way it would.
            deferred = getattr(super(), "call_soon_ack", None) or self.call_soon
            return deferred(p, *args, **kwargs)
        try:
            p(*args, **kwargs)
        except Exception:  # the ack of one message must not stop the consumer
            log.exception("ack or reject failed; the broker redelivers the message")
        return p


class SagaConsumer(ImmediateAckConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(_batch_prefetch(kwargs))
        super().__init__(*args, **kwargs)

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        handler = super().create_task_handler(*args, **kwargs)
        parts = getattr(self.app, "saga_parts", None)
        batching = batchers(self, handler, parts) if parts is not None else {}

        def on_task_received(message: Any) -> Any:
            try:
                body = message.decode()
            except Exception as exc:  # noqa: BLE001 - any decoder error means undecodable
                return self.on_decode_error(message, exc)
            queue = self._queue_of(message, parts) if parts is not None else None
            refused = self._refusal(message, body, queue)
            if refused is not None:
                return refused
            batcher = batching.get(queue or "")
            if batcher is not None and batcher.take(message, body):
                return None
            return handler(message)

        return on_task_received

    def _refusal(self, message: Any, body: Any, queue: str | None) -> bool | None:
        """Park a delivery ``queue`` gave that the task gate refuses (``core.gate``); True
        if it did."""
        parts = getattr(self.app, "saga_parts", None)
        if parts is None:
            return None
        headers = getattr(message, "headers", None)
        task = headers.get("task") if isinstance(headers, dict) else None
        if isinstance(task, str) and task not in getattr(self, "strategies", {}):
            return None  # no such task here: recorded as an unknown task (on_unknown_task)
        reason = parts.gate.refusal(queue, headers, body)
        if reason is None:
            return None
        metrics.TASKS_REFUSED.labels(queue=queue or "?").inc()
        log.warning(
            "message refused by the task gate: %s",
            reason,
            extra={"saga_id": _header(message, "saga_id"), "message_id": _header(message, "id")},
        )
        self._record(message, f"refused: {reason}")
        return True

    def _queue_of(self, message: Any, parts: Any) -> str | None:
        """The queue a delivery came from: the one its consumer tag consumes (the
        broker's word), else what its exchange and routing key route to."""
        delivery = getattr(message, "delivery_info", None) or {}
        tag = delivery.get("consumer_tag")
        active = getattr(getattr(self, "task_consumer", None), "_active_tags", None) or {}
        for queue, consumer_tag in active.items():
            if tag is not None and consumer_tag == tag:
                return str(queue)
        found: str | None = parts.topology.queue_for(
            delivery.get("exchange"), delivery.get("routing_key")
        )
        return found

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._record(message, f"undecodable body: {type(exc).__name__}: {_short(exc)}")

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._record(message, "not a task message (no task name in its headers)")

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        name = (getattr(message, "headers", None) or {}).get("task")
        self._record(message, f"unknown task {str(name)[:100]!r}")

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._record(message, f"invalid task message: {_short(exc)}")

    def _record(self, message: Any, reason: str) -> None:
        """Park the message as it arrived, record it, ack it. If it cannot be parked it
        is rejected into the dead-letter queue; once parked it is acked whatever the
        record does (the parked copy is what remains, and the intake stores it)."""
        headers = getattr(message, "headers", None)
        headers = headers if isinstance(headers, dict) else {}
        delivery = getattr(message, "delivery_info", None) or {}
        parts = getattr(self.app, "saga_parts", None)
        fields = {
            "saga_id": storable.optional_text(headers.get("saga_id")),
            "message_id": storable.optional_text(headers.get("id")),
        }
        queue = None
        try:
            if parts is None:
                raise ServiceUnavailable("saga app", "-", "worker has no saga app attached")
            body = getattr(message, "body", b"")
            properties = getattr(message, "properties", None) or {}
            queue = parts.topology.queue_for(delivery.get("exchange"), delivery.get("routing_key"))
            parts.holding.park_raw(
                body=body if isinstance(body, bytes) else str(body).encode(),
                headers=headers,
                content_type=properties.get("content_type")
                or getattr(message, "content_type", None),
                content_encoding=properties.get("content_encoding")
                or getattr(message, "content_encoding", None),
                reason=reason,
                from_queue=queue or str(delivery.get("routing_key") or "?"),
                sent_by=parts.failures.sender(message),
            )
        except Exception:
            # The broker away, or headers it will not take back: the original goes to the
            # dead-letter queue as it is, where the intake records it.
            log.exception("invalid message could not be parked; dead-lettering it", extra=fields)
            message.reject_log_error(log, self._connection_errors(), requeue=False)
            return
        if queue in {r.participant.queue for r in parts.runtimes.values()}:
            # A participant's database holds no saga tables: the parked copy is the record.
            invalid.observe(
                consumer=f"worker {getattr(self, 'hostname', '?')}",
                reason=reason,
                queue=queue,
                message_id=fields["message_id"],
                headers=headers,
            )
            message.ack_log_error(log, self._connection_errors())
            return
        try:
            invalid.record(
                parts.engine(),
                consumer=f"worker {getattr(self, 'hostname', '?')}",
                reason=reason,
                queue=queue,
                routing_key=delivery.get("routing_key"),
                task_name=str(headers.get("task"))[:200] if headers.get("task") else None,
                message_id=str(headers.get("id"))[:200] if headers.get("id") else None,
                headers=headers,
                body=getattr(message, "body", None),
            )
        except Exception:
            # Parked already: rejecting now would hold a second copy. The intake records
            # the parked one; this line says the invalid-message record is missing.
            metrics.MESSAGES.labels(consumer="worker", classification="invalid_unrecorded").inc()
            log.exception("invalid message parked but not recorded", extra=fields)
        message.ack_log_error(log, self._connection_errors())

    def _connection_errors(self) -> tuple[type[BaseException], ...]:
        errors: tuple[type[BaseException], ...] = getattr(self, "connection_errors", ())
        return errors


def _batch_prefetch(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A worker that batches holds at least a batch (its prefetch bounds one): the
    prefetch count raised to the largest batch of the queues it consumes that batch
    (``SAGA_REPLY_BATCH``, a participant's ``batch=``), and its multiplier with it."""
    app, pool = kwargs.get("app"), kwargs.get("pool")
    parts = getattr(app, "saga_parts", None)
    if parts is None or not in_process_pool(pool):
        return {}
    consumed = getattr(getattr(app, "amqp", None), "queues", None)
    consumed = getattr(consumed, "consume_from", None) or {}
    batch = max((n for q, n in batch_sizes(parts).items() if q in consumed), default=1)
    count = int(kwargs.get("initial_prefetch_count") or 0)
    if batch <= 1 or not count or count >= batch:
        return {}  # nothing batched here, no prefetch limit at all, or one large enough
    slots = max(int(getattr(pool, "limit", None) or 1), 1)
    log.info("prefetch raised from %d to %d: a batch (group commit)", count, batch)
    return {
        "initial_prefetch_count": batch,
        "prefetch_multiplier": max(int(kwargs.get("prefetch_multiplier") or 1), -(-batch // slots)),
    }


def _header(message: Any, name: str) -> str | None:
    headers = getattr(message, "headers", None)
    return storable.optional_text(headers.get(name)) if isinstance(headers, dict) else None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
