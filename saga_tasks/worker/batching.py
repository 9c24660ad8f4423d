"""Group commit of replies: the replies an orchestrator worker holds, in one transaction.

A reply costs a Celery task (a request, its trace, three events with ``-E``), a
transaction (begin, claim and lock, write, commit: a WAL flush) and a hand-off to the
sender thread. Under load the worker holds several replies at once (its prefetch); here
they are applied together: one transaction, one commit, one hand-off, then each acked.

    message arrives -> buffered; a flush is scheduled on the event loop
    flush -> read what else the socket holds already (never waiting for more)
          -> Orchestrator.handle_replies(batch): one transaction, or none of it
          -> committed: ack each | rolled back: each to Celery's own handler, alone

Idle, a reply is a batch of one, applied at once. A batch that raises anything (a reply
that makes no sense, a refused sender, an unknown saga, the database away) rolled back
whole, so each of its messages then runs as the ordinary ``saga_tasks.reply`` task, with
its failure policy, as if there were no batching: one bad reply fails alone, never its
neighbours. Only first deliveries are batched: a redelivered reply (its worker died
holding it) runs alone through the policy that counts such deaths.

Crash safety is the one-reply path's: acks follow the commit, so a worker killed before
it commits leaves every reply of the batch unacked (redelivered, applied alone), and one
killed after leaves them committed with their inbox rows (redelivered, ignored as
duplicates); committed commands not yet published are the outbox's to recover.

What changes for people watching: Flower shows no task for a batched reply (it never
becomes a Celery task); the saga's history, the dashboard and the metrics
(``saga_messages_total``, ``saga_reply_batch_size``) show each one.
``SAGA_REPLY_BATCH=1`` turns this off; it is on for the pools whose tasks run in the
consumer's process (``-P solo``, ``-P threads``), off under prefork.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from saga_tasks.core.messages import REPLY_TASK
from saga_tasks.messaging.topology import REPLY_QUEUE
from saga_tasks.observability import metrics
from saga_tasks.runtime.orchestrator import DeliveredReply

log = logging.getLogger("saga_tasks.worker.batching")

_NOTHING_TO_READ = (TimeoutError, BlockingIOError, InterruptedError)
"""What a non-blocking read raises when the socket holds no more (``socket.timeout`` is
``TimeoutError``)."""


def in_process_pool(pool: Any) -> bool:
    """Whether tasks of ``pool`` run in the consumer's own process (solo, threads).

    A prefork parent must not apply batches: it would open database connections and a
    sender thread in the process that forks the pool's children (a lock a thread holds
    at a fork stays held in the child forever). Under prefork every reply is a task.
    """
    module = type(pool).__module__
    return module in ("celery.concurrency.solo", "celery.concurrency.thread")


class ReplyBatcher:
    """Buffers the replies a consumer receives and applies them a batch at a time."""

    def __init__(self, consumer: Any, handler: Callable[[Any], Any], parts: Any) -> None:
        self._consumer = consumer
        self._handler = handler
        self._parts = parts
        self.limit: int = parts.settings.reply_batch
        self._pending: list[tuple[Any, DeliveredReply]] = []
        self._scheduled = False

    def take(self, message: Any, body: Any, queue: str | None) -> bool:
        """Buffer ``message`` if it is a first delivery of a reply; False to run it as a task."""
        hub = getattr(self._consumer, "hub", None)
        if hub is None or not in_process_pool(getattr(self._consumer, "pool", None)):
            return False  # no event loop to flush from, or a parent that forks: tasks
        reply = self._reply(message, body, queue)
        if reply is None:
            return False
        self._pending.append((message, reply))
        if not self._scheduled:
            # A timer due now, not call_soon: the hub fires timers after this pass of
            # ready callbacks and before it polls, while a callback scheduled from inside
            # one of kombu's own ready callbacks (its reader re-schedules itself) waits
            # for the next poll to return: with the prefetch window full of held
            # replies, that is the next timer, up to a second later.
            self._scheduled = True
            hub.call_later(0, self.flush)
        return True

    def _reply(self, message: Any, body: Any, queue: str | None) -> DeliveredReply | None:
        headers = getattr(message, "headers", None)
        delivery = getattr(message, "delivery_info", None) or {}
        if (
            queue != REPLY_QUEUE
            or not isinstance(headers, dict)
            or headers.get("task") != REPLY_TASK
            or delivery.get("redelivered")
            or headers.get("eta")
            or not isinstance(headers.get("id"), str)
        ):
            return None
        if not (isinstance(body, (list, tuple)) and len(body) == 3):
            return None  # not protocol 2 (args, kwargs, embed): Celery's task reads it
        args, kwargs, _embed = body
        if not isinstance(kwargs, dict) or not isinstance(args, (list, tuple)):
            return None
        return DeliveredReply(
            message_id=headers["id"],
            headers=headers,
            body=kwargs if not args else {"args": list(args), **kwargs},
            sender=self._parts.failures.sender(message),
        )

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

    def _apply(self, batch: list[tuple[Any, DeliveredReply]]) -> None:
        if not batch:
            return
        try:
            self._parts.orchestrator.handle_replies([reply for _, reply in batch])
        except Exception as exc:  # noqa: BLE001 - every reply is then applied alone
            metrics.REPLY_BATCHES_FAILED.inc()
            first = batch[0][1]
            log.warning(
                "reply batch of %d rolled back (%s: %s); applying each reply alone",
                len(batch),
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
                extra={
                    "message_id": first.message_id,
                    "saga_id": (first.headers or {}).get("saga_id"),
                },
            )
            for message, _ in batch:
                self._handler(message)
            return
        metrics.REPLY_BATCHES.observe(len(batch))
        errors = getattr(self._consumer, "connection_errors", ())
        for message, _ in batch:
            message.ack_log_error(log, errors)
