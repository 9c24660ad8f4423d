"""Beat's scheduler: redbeat's, which keeps one beat active by a lease in Redis, plus the
app's schedules (``SagaApp(schedules=[...])``).

On every pass, after redbeat has renewed its lease (a beat that lost it stops there), the
active beat sends one firing per due tick to the maintenance queue, the tick in the
message, and notes the newest tick it handled in Redis, under the deployment's beat
prefix, once the broker confirmed the firing into the queue (publisher confirms, and a
mandatory publish: a nack, a lost connection or a firing routed nowhere raises, and the
tick is sent again at the next pass). A standby that takes over reads that note and goes
on from it. A beat killed between sending and noting makes its successor send that tick
again, and the tick's business key makes the second firing find the first one's saga.
Beat sleeps until the next tick is due, at most its usual longest sleep.

Celery loads this class by name (``beat_scheduler``); nothing else imports it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from typing import Any, Protocol

from redbeat import RedBeatScheduler
from redbeat.schedulers import get_redis

from saga_tasks.core.schedules import Schedule, format_tick, parse_tick, plan
from saga_tasks.errors import PublishFailed
from saga_tasks.messaging.topology import MAINTENANCE_QUEUE
from saga_tasks.runtime.schedules import Timetable
from saga_tasks.urls import mask_url
from saga_tasks.worker.beat import FIRE_SCHEDULE_TASK

log = logging.getLogger("saga_tasks.worker.scheduler")

WAKE_AFTER = 0.005
"""Seconds beat wakes after a tick is due, so its clock reads the tick as come."""
FIRING_IDS = uuid.UUID("6f0d2a52-3c39-4d51-9a0e-5b1f4d0c7a11")
"""Namespace of firing ids: a tick sent twice is sent under one task id."""


class TickBook(Protocol):
    """Where the active beat notes the newest tick it handled, per schedule."""

    def last(self, schedule: str) -> datetime | None: ...

    def note(self, schedule: str, tick: datetime) -> None: ...


class RedisTickBook:
    """The notes in Redis, next to redbeat's own keys (``forget_beat_state`` drops both)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _key(self, schedule: str) -> str:
        return f"{self.prefix}schedule:{schedule}"

    def last(self, schedule: str) -> datetime | None:
        raw = self.client.get(self._key(schedule))
        if raw is None:
            return None
        try:
            return parse_tick(raw.decode() if isinstance(raw, bytes) else str(raw))
        except ValueError:
            log.warning(
                "unreadable last tick in Redis: starting afresh", extra={"schedule": schedule}
            )
            return None

    def note(self, schedule: str, tick: datetime) -> None:
        self.client.set(self._key(schedule), format_tick(tick))


Send = Callable[[Schedule, datetime, int], None]
"""Sends the firing of one tick, with the count of ticks missed before it."""


def fire_due(timetable: Timetable, book: TickBook, send: Send, now: datetime) -> float | None:
    """Send every due tick of every schedule (``plan``); the seconds until the next one is
    due (None: no schedule). A send that fails leaves its tick and those after it for the
    next pass."""
    waits = []
    for schedule in timetable.schedules:
        fields = {"schedule": schedule.name}
        last = book.last(schedule.name)
        planned = plan(schedule, last, now)
        if not planned.fire and planned.seen is not None and planned.seen != last:
            book.note(schedule.name, planned.seen)  # first seen: its next tick is its first
        for index, tick in enumerate(planned.fire):
            missed = planned.missed if index == 0 else 0
            try:
                send(schedule, tick, missed)
            except Exception as exc:  # noqa: BLE001 - the broker may fail in any way
                log.error(
                    "cannot send the firing of a tick (%s): sent again next pass",
                    type(exc).__name__,
                    extra={**fields, "tick": format_tick(tick)},
                )
                break
            book.note(schedule.name, tick)
        if planned.missed:
            log.warning(
                "%d ticks missed: beat was away or too late for them; none is started",
                planned.missed,
                extra=fields,
            )
        waits.append((schedule.next_tick(now) - now).total_seconds())
    return min(waits) + WAKE_AFTER if waits else None


class SagaBeat(RedBeatScheduler):  # type: ignore[misc]
    """Redbeat's scheduler that also fires the app's schedules."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # Redbeat renews the lease first and raises if another beat holds it: only the
        # active beat gets past this line.
        interval = float(super().tick(*args, **kwargs))
        parts = getattr(self.app, "saga_parts", None)
        timetable: Timetable | None = getattr(parts, "timetable", None)
        if timetable is None or not timetable.schedules:
            return interval
        try:
            book = RedisTickBook(get_redis(self.app), self.app.redbeat_conf.key_prefix)
            wait = fire_due(timetable, book, self._send, timetable.clock.now())
        except Exception as exc:  # noqa: BLE001 - Redis may fail in any way; beat goes on
            log.error(
                "cannot read or note the schedules' ticks (%s): next pass", type(exc).__name__
            )
            return interval
        return interval if wait is None else max(min(interval, wait), 0.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._returned_ids: set[str] = set()
        """Task ids of firings the broker returned: it routed them to no queue."""
        super().__init__(*args, **kwargs)

    @cached_property
    def producer(self) -> Any:
        """Celery beat's producer, told of firings the broker returns (``_returned``)."""
        return self.Producer(self._ensure_connected(), auto_declare=False, on_return=self._returned)

    def _returned(self, _exc: Any, _exchange: str, _key: str, message: Any) -> None:
        properties = getattr(message, "properties", None) or {}
        headers = properties.get("application_headers") or {}
        self._returned_ids.add(str(headers.get("id") or properties.get("correlation_id")))

    def _send(self, schedule: Schedule, tick: datetime, missed: int) -> None:
        """Send one firing; return only once the broker confirmed it into a queue.

        The broker confirms a publish it routed nowhere as it confirms one it stored
        (kombu declares a queue once per connection: a queue deleted since is not there),
        so the firing is mandatory: one returned raises, the tick is left for the next
        pass, and that pass declares the queue again."""
        when = format_tick(tick)
        task_id = str(uuid.uuid5(FIRING_IDS, f"{schedule.name}@{when}"))
        producer = self.producer
        self._returned_ids.discard(task_id)
        self.app.send_task(
            FIRE_SCHEDULE_TASK,
            kwargs={"schedule": schedule.name, "tick": when, "missed": missed},
            queue=MAINTENANCE_QUEUE,
            producer=producer,
            task_id=task_id,
            headers={"celery_beat_task": True},
            mandatory=True,
        )
        if task_id in self._returned_ids:
            self._returned_ids.discard(task_id)
            queue = self.app.amqp.queues[MAINTENANCE_QUEUE]
            producer.connection.declared_entities.discard(hash(queue))
            raise PublishFailed(
                "RabbitMQ",
                mask_url(producer.connection.as_uri()),
                f"the firing was returned unroutable: no queue {MAINTENANCE_QUEUE} took it",
            )
        log.info("fired", extra={"schedule": schedule.name, "tick": when})
