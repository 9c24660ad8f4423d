"""Group commit: the replies (or commands) a worker holds, applied in one transaction.

A reply costs a Celery task (a request, its trace, three events with ``-E``), a
transaction (begin, claim and lock, write, commit: a WAL flush) and a hand-off to the
sender thread. Under load the worker holds several replies at once (its prefetch); here
they are applied together: one transaction, one commit, one hand-off, then each acked.

    message arrives -> buffered; a flush is scheduled on the event loop
    flush -> read what else the socket holds already (never waiting for more)
          -> Orchestrator.handle_replies(batch): one transaction, or none of it
          -> committed: ack each | rolled back: each to Celery's own handler, alone

Idle, a reply is a batch of one, applied at once. A batch that raises anything (a reply
that makes no sense, a refused sender, an unknown saga, the database away) is rolled back
whole, so each of its messages then runs as the ordinary ``saga_tasks.reply`` task, with
its failure policy, as if there were no batching: one bad reply fails alone, never its
neighbours. Only first deliveries are batched: a redelivered reply (its worker died
holding it) runs alone through the policy that counts such deaths.

Crash safety is the one-reply path's: acks follow the commit, so a worker killed before
it commits leaves every reply of the batch unacked (redelivered, applied alone), and one
killed after leaves them committed with their inbox rows (redelivered, ignored as
duplicates); committed commands not yet published are the outbox's to recover.

A participant that says ``batch=`` (``Participant``) has its commands run the same way:
one transaction of its database for the commands its worker holds (ledger claims,
handlers, replies in its outbox), one commit, then each acked; any failure (a refusal
included) rolls the batch back and each command runs alone as its task. A command a hook
probes (the demo's faults) is never batched.

What changes for people watching: Flower shows no task for a batched message (it never
becomes a Celery task); the saga's history, the dashboard and the metrics
(``saga_messages_total``, ``saga_batch_size``) show each one.
``SAGA_REPLY_BATCH=1`` turns it off for replies, a participant's ``batch=1`` (the default)
for its commands, ``SAGA_GROUP_COMMIT=0`` for both; it is on only for the pools whose tasks
run in the consumer's process (``-P solo``, ``-P threads``), never under prefork.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from saga_tasks.core.messages import REPLY_TASK
from saga_tasks.messaging.topology import REPLY_QUEUE
from saga_tasks.observability import metrics
from saga_tasks.persistence.tables import ORCHESTRATOR
from saga_tasks.runtime.orchestrator import DeliveredReply
from saga_tasks.runtime.participant import DeliveredCommand, ParticipantRuntime

log = logging.getLogger("saga_tasks.worker.batching")

_NOTHING_TO_READ = (TimeoutError, BlockingIOError, InterruptedError)
"""What a non-blocking read raises when the socket holds no more (``socket.timeout`` is
``TimeoutError``)."""


def in_process_pool(pool: Any) -> bool:
    """Whether tasks of ``pool`` run in the consumer's own process (solo, threads).

    A prefork parent must not apply batches: it would open database connections and a
    sender thread in the process that forks the pool's children (a lock a thread holds
    at a fork stays held in the child forever). Under prefork every message is a task.
    """
    module = type(pool).__module__
    return module in ("celery.concurrency.solo", "celery.concurrency.thread")


def batch_sizes(parts: Any) -> dict[str, int]:
    """The queues whose first deliveries are batched, and the size of a batch of each."""
    if not parts.settings.group_commit:
        return {}
    sizes = {REPLY_QUEUE: parts.settings.reply_batch}
    for runtime in parts.runtimes.values():
        queue = runtime.participant.queue
        sizes[queue] = min(sizes.get(queue, runtime.participant.batch), runtime.participant.batch)
    return {queue: size for queue, size in sizes.items() if size > 1}


def batchers(consumer: Any, handler: Callable[[Any], Any], parts: Any) -> dict[str, Batcher]:
    """A batcher per queue that batches (two participants sharing a queue: neither); none
    without an event loop to flush from, or in a parent that forks (prefork)."""
    if getattr(consumer, "hub", None) is None or not in_process_pool(
        getattr(consumer, "pool", None)
    ):
        return {}
    found: dict[str, Batcher] = {}
    shared = _shared_queues(parts.runtimes)
    for queue, size in batch_sizes(parts).items():
        if queue == REPLY_QUEUE:
            found[queue] = ReplyBatcher(consumer, handler, parts, size)
        elif queue not in shared:
            runtime = next(r for r in parts.runtimes.values() if r.participant.queue == queue)
            found[queue] = CommandBatcher(consumer, handler, parts, size, runtime)
    return found


def _shared_queues(runtimes: Mapping[str, ParticipantRuntime]) -> set[str]:
    seen: set[str] = set()
    shared: set[str] = set()
    for runtime in runtimes.values():
        queue = runtime.participant.queue
        (shared if queue in seen else seen).add(queue)
    return shared


class Batcher:
    """Buffers the first deliveries of one queue and applies them a batch at a time."""

    consumer_name = ORCHESTRATOR

    def __init__(
        self, consumer: Any, handler: Callable[[Any], Any], parts: Any, limit: int
    ) -> None:
        self._consumer = consumer
        self._handler = handler
        self._parts = parts
        self.limit = limit
        self._pending: list[tuple[Any, Any]] = []
        self._scheduled = False

    def take(self, message: Any, body: Any) -> bool:
        """Buffer ``message`` if it is a first delivery this batcher can read; False to run
        it as a task."""
        item = self._read(message, body)
        if item is None:
            return False
        self._pending.append((message, item))
        if not self._scheduled:
            # A timer due now, not call_soon: the hub fires timers after this pass of
            # ready callbacks and before it polls, while a callback scheduled from inside
            # one of kombu's own ready callbacks (its reader re-schedules itself) waits
            # for the next poll to return: with the prefetch window full of held
            # messages, that is the next timer, up to a second later.
            self._scheduled = True
            self._consumer.hub.call_later(0, self.flush)
        return True

    def _read(self, message: Any, body: Any) -> Any:
        """The item to batch, or None when the message must run as its task."""
        headers = getattr(message, "headers", None)
        delivery = getattr(message, "delivery_info", None) or {}
        if (
            not isinstance(headers, dict)
            or delivery.get("redelivered")
            or headers.get("eta")
            or headers.get("retries")
            or headers.get("saga_retry")
            or not isinstance(headers.get("id"), str)
        ):
            return None
        if not (isinstance(body, (list, tuple)) and len(body) == 3):
            return None  # not protocol 2 (args, kwargs, embed): Celery's task reads it
        args, kwargs, _embed = body
        if not isinstance(kwargs, dict) or not isinstance(args, (list, tuple)):
            return None
        return self._item(message, headers, kwargs if not args else {"args": list(args), **kwargs})

    def _item(self, message: Any, headers: dict[str, Any], body: Any) -> Any:
        raise NotImplementedError

    def _apply_items(self, items: Sequence[Any]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Read what the socket already holds (up to the limit), then apply the batch."""
        failure: BaseException | None = None
        try:
            connection = self._consumer.connection
            while len(self._pending) < self.limit:
                connection.drain_events(timeout=0)
        except _NOTHING_TO_READ:
            pass
        except Exception as exc:  # noqa: BLE001 - the loop's to handle, once the batch is done
            failure = exc
        finally:
            batch, self._pending = self._pending, []
            self._scheduled = False
        self._apply(batch)
        if failure is not None:
            raise failure  # a lost connection: Celery's loop restarts the consumer

    def _apply(self, batch: list[tuple[Any, Any]]) -> None:
        if not batch:
            return
        try:
            self._apply_items([item for _, item in batch])
        except Exception as exc:  # noqa: BLE001 - every message is then applied alone
            metrics.BATCHES_FAILED.labels(consumer=self.consumer_name).inc()
            first = batch[0][1]
            log.warning(
                "batch of %d rolled back (%s: %s); applying each message alone",
                len(batch),
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
                extra={
                    "message_id": first.message_id,
                    "saga_id": (first.headers or {}).get("saga_id"),
                    "consumer": self.consumer_name,
                },
            )
            for message, _ in batch:
                self._handler(message)
            return
        metrics.BATCHES.labels(consumer=self.consumer_name).observe(len(batch))
        errors = getattr(self._consumer, "connection_errors", ())
        for message, _ in batch:
            message.ack_log_error(log, errors)


class ReplyBatcher(Batcher):
    """Replies, applied by ``Orchestrator.handle_replies``."""

    def _item(self, message: Any, headers: dict[str, Any], body: Any) -> DeliveredReply | None:
        if headers.get("task") != REPLY_TASK:
            return None
        return DeliveredReply(
            message_id=headers["id"],
            headers=headers,
            body=body,
            sender=self._parts.failures.sender(message),
        )

    def _apply_items(self, items: Sequence[Any]) -> None:
        self._parts.orchestrator.handle_replies(items)


class CommandBatcher(Batcher):
    """One participant's commands, run by ``ParticipantRuntime.execute_batch``."""

    def __init__(
        self,
        consumer: Any,
        handler: Callable[[Any], Any],
        parts: Any,
        limit: int,
        runtime: ParticipantRuntime,
    ) -> None:
        super().__init__(consumer, handler, parts, limit)
        self._runtime = runtime
        self.consumer_name = runtime.participant.name
        self._handlers = {h.task_name: h for h in runtime.participant.handlers.values()}

    def _item(self, message: Any, headers: dict[str, Any], body: Any) -> DeliveredCommand | None:
        handler = self._handlers.get(headers.get("task"))  # type: ignore[arg-type]
        if handler is None:
            return None
        return DeliveredCommand(
            handler=handler,
            message_id=headers["id"],
            headers=headers,
            body=body,
            sender=self._parts.failures.sender(message),
        )

    def _apply_items(self, items: Sequence[Any]) -> None:
        self._runtime.execute_batch(items)
