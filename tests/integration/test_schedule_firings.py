"""Beat notes a tick in Redis only once the broker took its firing into the maintenance
queue, against real RabbitMQ and Redis: a firing the broker refuses (a nack) or routes
nowhere (the queue deleted after beat declared it) leaves its tick for the next pass."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from kombu import Connection
from redbeat.schedulers import get_redis

from saga_tasks.core.schedules import format_tick
from saga_tasks.messaging.celery_config import forget_beat_state
from saga_tasks.messaging.topology import MAINTENANCE_QUEUE, declare_topology
from saga_tasks.testing import RabbitAdmin, drain, queue_depths, wait_for
from saga_tasks.worker.scheduler import RedisTickBook, SagaBeat, fire_due
from tests.scheduled_app import build

SECOND = timedelta(seconds=1)
EVERY_SECOND = ("every-second", "every-second-default")

pytestmark = pytest.mark.filterwarnings(
    # redbeat falls back to broker_transport_options for Redis, and says so once a process
    "ignore:RedBeat will stop falling back:DeprecationWarning"
)


@pytest.fixture
def beat(settings):
    app = build(settings)
    declare_topology(settings.broker_url, app.topology)
    scheduler = SagaBeat(app=app.celery, lazy=True)
    book = RedisTickBook(get_redis(app.celery), app.celery.redbeat_conf.key_prefix)
    yield app, scheduler, book
    forget_beat_state(settings)
    scheduler.producer.connection.release()
    app.close()


def firings(url):
    return sorted(
        (m["kwargs"]["schedule"], m["kwargs"]["tick"]) for m in drain(url, MAINTENANCE_QUEUE)
    )


def test_a_firing_routed_nowhere_leaves_its_tick_for_the_next_pass(beat, settings, caplog):
    app, scheduler, book = beat
    url = settings.broker_url
    first = datetime.now(UTC).replace(microsecond=0)
    for name in EVERY_SECOND:
        book.note(name, first - SECOND)
    fire_due(app.timetable, book, scheduler._send, first)  # declares the queue, once
    assert firings(url) == [(name, format_tick(first)) for name in EVERY_SECOND]
    with Connection(url) as conn:
        conn.channel().queue_delete(MAINTENANCE_QUEUE)

    caplog.set_level(logging.ERROR, logger="saga_tasks.worker.scheduler")
    second = first + SECOND
    fire_due(app.timetable, book, scheduler._send, second)

    # The first firing came back: its tick is left. It declared the queue again, so the
    # next schedule's firing went in.
    assert [book.last(name) for name in EVERY_SECOND] == [first, second]
    assert [r.schedule for r in caplog.records if "cannot send the firing" in r.getMessage()] == [
        "every-second"
    ]
    fire_due(app.timetable, book, scheduler._send, second)  # declares the queue again
    assert {name: book.last(name) for name in EVERY_SECOND} == dict.fromkeys(EVERY_SECOND, second)
    assert firings(url) == [(name, format_tick(second)) for name in EVERY_SECOND]


def test_a_firing_the_broker_refuses_leaves_its_tick_for_the_next_pass(beat, settings):
    """Publisher confirms: a nack (the queue full, rejecting publishes) raises."""
    app, scheduler, book = beat
    url = settings.broker_url
    vhost = quote(Connection(url).virtual_host, safe="")
    admin = RabbitAdmin()
    admin._request(
        "PUT",
        f"/policies/{vhost}/full",
        {
            "pattern": rf"^{MAINTENANCE_QUEUE}$".replace(".", r"\."),
            "definition": {"max-length": 0, "overflow": "reject-publish"},
            "apply-to": "queues",
        },
    )

    def policy():
        found = admin._request("GET", f"/queues/{vhost}/{MAINTENANCE_QUEUE}")
        return found.get("effective_policy_definition") or None

    wait_for(policy, timeout=10, describe="the policy on the maintenance queue")
    now = datetime.now(UTC).replace(microsecond=0)
    for name in EVERY_SECOND:
        book.note(name, now - SECOND)

    fire_due(app.timetable, book, scheduler._send, now)

    assert {name: book.last(name) for name in EVERY_SECOND} == dict.fromkeys(
        EVERY_SECOND, now - SECOND
    )
    admin._request("DELETE", f"/policies/{vhost}/full")
    wait_for(lambda: not policy(), timeout=10, describe="the policy gone")
    fire_due(app.timetable, book, scheduler._send, now)
    assert {name: book.last(name) for name in EVERY_SECOND} == dict.fromkeys(EVERY_SECOND, now)
    assert queue_depths(url, [MAINTENANCE_QUEUE]) == {MAINTENANCE_QUEUE: 2}
