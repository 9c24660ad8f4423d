"""Publish-after-commit without making the task wait: one sender thread per process.

A task commits its outbox rows and hands the messages to ``Dispatcher.send``, which
only queues them. The sender thread owns one AMQP connection whose channel is in
confirm mode; it publishes (``mandatory``) without waiting, reads the broker's acks,
nacks and returns as they come, and marks confirmed rows ``published_at`` in one
UPDATE per outbox table every ``mark_interval`` seconds.

Nothing here is needed for correctness: the rows are committed before they are
queued, and anything not confirmed and marked (a crash, a nack, an unroutable
message, a lost connection, a full queue) stays unpublished in its outbox, where
recovery publishes it again; consumers deduplicate. What it buys is that neither
the broker's confirm round trip nor the marking transaction sits between one
message and the next on a worker: measured in the benchmark (README, Performance).

``flush`` waits until everything sent so far is confirmed and marked, or given up:
for tests, for a process about to exit, and for the demo's crash-after-publish point.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import queue
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from amqp.exceptions import AMQPError
from kombu import Connection
from sqlalchemy import Engine, Table

from saga_tasks.core.messages import OutboundMessage
from saga_tasks.observability import metrics
from saga_tasks.persistence import outbox
from saga_tasks.persistence.db import translated
from saga_tasks.urls import mask_url

log = logging.getLogger("saga_tasks.dispatcher")

_live: weakref.WeakSet[Dispatcher] = weakref.WeakSet()

Encoded = tuple[str, str, Any]
"""(exchange, routing key, ``amqp.Message``) of one outbox message."""


@dataclass
class _Item:
    seq: int
    table: Table
    message: OutboundMessage
    encoded: Encoded


class Dispatcher:
    """Queues committed outbox messages; a thread publishes them and marks them published."""

    def __init__(
        self,
        *,
        broker_url: str,
        encode: Callable[[OutboundMessage], Encoded],
        engine: Callable[[Table], Engine],
        mark_interval: float = 0.25,
        capacity: int = 10_000,
        connect_timeout: float = 5.0,
    ) -> None:
        self.broker_url = broker_url
        self._encode = encode
        self._engine = engine
        self.mark_interval = mark_interval
        self.connect_timeout = connect_timeout
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=capacity)
        self._seq = itertools.count(1)
        self._lock = threading.Condition()
        self._unsettled: deque[int] = deque()
        self._settled: set[int] = set()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._flush_wanted = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="saga-dispatcher", daemon=True)
        self._thread.start()
        _live.add(self)
        atexit.register(self.close)

    # -- the caller's side ------------------------------------------------------------------

    def send(self, table: Table, messages: Sequence[OutboundMessage]) -> None:
        """Queue committed messages for publishing; never blocks on the broker."""
        for message in messages:
            encoded = self._encode(message)
            with self._lock:
                seq = next(self._seq)
                self._unsettled.append(seq)
            try:
                self._queue.put_nowait(_Item(seq, table, message, encoded))
            except queue.Full:
                self._settle([seq])
                metrics.PUBLISH_FAILURES.labels(path="after_commit").inc()
                log.warning(
                    "publish queue full; recovery will publish the message",
                    extra={"saga_id": message.saga_id, "message_id": message.message_id},
                )
        if messages:
            self._wake()

    def flush(self, timeout: float) -> bool:
        """Wait until everything sent so far is confirmed and marked, or given up to
        recovery; False if ``timeout`` passed first."""
        with self._lock:
            target = next(self._seq) - 1  # burns one number: harmless, never used
        self._flush_wanted.set()
        self._wake()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._unsettled and self._unsettled[0] <= target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._lock.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Flush, then stop the thread (at exit, and when a worker process shuts down)."""
        if os.getpid() != self._pid or self._stop.is_set():
            return
        self.flush(timeout)
        self._stop.set()
        self._wake()
        self._thread.join(timeout)
        atexit.unregister(self.close)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: the thread is awake
            self._wake_w.send(b"\0")

    def _settle(self, seqs: Sequence[int]) -> None:
        with self._lock:
            self._settled.update(seqs)
            while self._unsettled and self._unsettled[0] in self._settled:
                self._settled.discard(self._unsettled.popleft())
            self._lock.notify_all()

    # -- the sender thread ------------------------------------------------------------------

    def _run(self) -> None:
        sender = _Sender(self)
        while not self._stop.is_set():
            try:
                sender.cycle()
            except Exception:  # the thread must outlive any one failure
                log.exception("dispatcher cycle failed; unconfirmed messages go to recovery")
                sender.give_up_inflight("dispatcher error")
                sender.disconnect()
                self._stop.wait(0.5)
        sender.mark()
        sender.give_up_inflight("process stopping")
        sender.disconnect()


def flush_all(timeout: float = 5.0) -> bool:
    """Flush every dispatcher of this process (tests look at the broker after this)."""
    pid = os.getpid()
    return all(d.flush(timeout) for d in list(_live) if d._pid == pid)


class _Sender:
    """State only the sender thread touches: the connection, in-flight and confirmed items."""

    def __init__(self, owner: Dispatcher) -> None:
        self.owner = owner
        self.connection: Any = None
        self.channel: Any = None
        self.next_tag = 1
        self.inflight: dict[int, _Item] = {}
        self.returned: set[str] = set()
        self.confirmed: dict[int, list[_Item]] = {}
        self.tables: dict[int, Table] = {}
        """Confirmed items and their outbox table, by the table's identity: two tables of
        one name may live in two databases (participants with databases of their own)."""
        self.last_mark = time.monotonic()
        self.retry_at = 0.0

    def cycle(self) -> None:
        owner = self.owner
        busy = bool(self.inflight or self.confirmed)
        wait = owner.mark_interval if busy else 1.0
        sources: list[Any] = [owner._wake_r]
        if self.connection is not None:
            sources.append(self.connection.sock)
        readable, _, _ = select.select(sources, [], [], wait)
        if owner._wake_r in readable:
            try:
                while owner._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass
        self.publish_queued()
        if self.connection is not None:
            self.read_confirms()
        if self.confirmed and (
            owner._flush_wanted.is_set()
            or time.monotonic() - self.last_mark >= owner.mark_interval
            or sum(len(v) for v in self.confirmed.values()) >= 500
        ):
            self.mark()
        if owner._flush_wanted.is_set() and not self.inflight and owner._queue.empty():
            owner._flush_wanted.clear()

    def connect(self) -> bool:
        if self.connection is not None:
            return True
        if time.monotonic() < self.retry_at:
            return False

        try:
            kombu_connection = Connection(
                self.owner.broker_url, connect_timeout=self.owner.connect_timeout, heartbeat=30
            )
            kombu_connection.connect()
            raw = kombu_connection.connection
            channel = raw.channel()
            channel.confirm_select()
        except Exception as exc:  # noqa: BLE001 - any connect failure: back off, recovery covers
            self.retry_at = time.monotonic() + 1.0
            log.warning(
                "dispatcher cannot reach RabbitMQ at %s: %s; messages wait for recovery",
                mask_url(self.owner.broker_url),
                exc,
            )
            return False
        channel.events["basic_ack"].add(self.on_ack)
        channel.events["basic_nack"].add(self.on_nack)
        channel.events["basic_return"].add(self.on_return)
        self.kombu_connection = kombu_connection
        self.connection, self.channel, self.next_tag = raw, channel, 1
        return True

    def disconnect(self) -> None:
        if self.connection is None:
            return
        try:
            self.kombu_connection.close()
        except Exception:  # closing a broken connection may fail; it is gone either way
            log.debug("closing the dispatcher connection failed", exc_info=True)
        self.connection = self.channel = None

    def publish_queued(self) -> None:
        q = self.owner._queue
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                return
            if not self.connect():
                self.give_up([item], "broker unreachable")
                continue
            exchange, routing_key, message = item.encoded
            try:
                self.channel.basic_publish(
                    message, exchange=exchange, routing_key=routing_key, mandatory=True
                )
            except Exception as exc:  # noqa: BLE001 - a dead connection: recovery republishes
                self.give_up([item], f"publish failed: {exc}")
                self.give_up_inflight("connection lost")
                self.disconnect()
                continue
            self.inflight[self.next_tag] = item
            self.next_tag += 1

    def read_confirms(self) -> None:
        try:
            self.connection.heartbeat_tick()
            while True:
                self.connection.drain_events(timeout=0)
        except TimeoutError:
            return
        except (AMQPError, OSError) as exc:
            self.give_up_inflight(f"connection lost: {exc}")
            self.disconnect()

    def _take(self, delivery_tag: int, multiple: bool) -> list[_Item]:
        if not multiple:
            item = self.inflight.pop(delivery_tag, None)
            return [item] if item is not None else []
        tags = [t for t in self.inflight if t <= delivery_tag]
        return [self.inflight.pop(t) for t in tags]

    def on_ack(self, delivery_tag: int, multiple: bool) -> None:
        for item in self._take(delivery_tag, multiple):
            if item.message.message_id in self.returned:
                self.returned.discard(item.message.message_id)
                self.give_up([item], "unroutable (returned by the broker)")
                continue
            key = id(item.table)
            self.tables[key] = item.table
            self.confirmed.setdefault(key, []).append(item)

    def on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self.give_up(self._take(delivery_tag, multiple), "nacked by the broker")

    def on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        message_id = (getattr(message, "properties", None) or {}).get("correlation_id")
        if message_id:
            self.returned.add(str(message_id))
        log.warning(
            "message returned unroutable: %s (exchange %s, routing key %s)",
            exc,
            exchange,
            routing_key,
            extra={"message_id": message_id},
        )

    def mark(self) -> None:
        if not self.confirmed:
            return
        batches, self.confirmed = self.confirmed, {}
        self.last_mark = time.monotonic()
        for key, items in batches.items():
            table = self.tables[key]
            name = f"{table.schema}.{table.name}"
            engine = self.owner._engine(table)
            try:
                with translated(engine.url), engine.begin() as conn:
                    outbox.mark_published(conn, table, [i.message.message_id for i in items])
            except Exception as exc:  # noqa: BLE001 - unmarked rows are republished by recovery
                first = items[0].message
                log.warning(
                    "could not mark %d published rows of %s: %s; recovery republishes them",
                    len(items),
                    name,
                    exc,
                    extra={"saga_id": first.saga_id, "message_id": first.message_id},
                )
            self.owner._settle([i.seq for i in items])

    def give_up(self, items: Sequence[_Item], reason: str) -> None:
        if not items:
            return
        metrics.PUBLISH_FAILURES.labels(path="after_commit").inc(len(items))
        first = items[0].message
        log.warning(
            "%d message(s) not confirmed (%s); recovery publishes them",
            len(items),
            reason,
            extra={"saga_id": first.saga_id, "message_id": first.message_id},
        )
        self.owner._settle([i.seq for i in items])

    def give_up_inflight(self, reason: str) -> None:
        items, self.inflight = list(self.inflight.values()), {}
        self.returned.clear()
        self.give_up(items, reason)
