"""The intake stores each delivery once: two publishes are two rows however alike they
are, and a message RabbitMQ delivers again after its ack was lost is not a second row.
Real RabbitMQ redelivers (a channel closed with the message unacked); nothing is mocked."""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection

from saga_tasks.errors import ServiceUnavailable
from saga_tasks.messaging.taker import RawMessage, take
from saga_tasks.runtime import intake as intake_module
from saga_tasks.runtime.holding import PARKING
from saga_tasks.testing import queue_depths
from tests.helpers import held

GARBAGE = b"garbage"
OUTAGE = ServiceUnavailable("PostgreSQL", "postgresql://127.0.0.1/x", "test outage")


def park(url: str, body: bytes = GARBAGE, headers: dict | None = None, **properties) -> None:
    """Bytes published straight to the parking exchange, as any service may hold them."""
    with Connection(url) as conn:
        channel = conn.channel()
        message = channel.prepare_message(body, headers=headers or {}, properties=properties)
        channel.basic_publish(message, exchange="saga.parking", routing_key="saga.parking_lot")
        channel.close()


class Crash(BaseException):
    """The intake's process dies after a commit, before its ack."""


def test_parked_messages_alike_in_body_and_without_a_task_id_are_a_row_each(order_app, settings):
    url = settings.broker_url
    park(url)
    park(url)  # alike in every byte: only the broker's redelivered flag tells them apart
    park(url, message_id="m-1")
    park(url, message_id="m-2")
    park(url, headers={"note": "a"})
    park(url, headers={"note": "b"})

    report = order_app.intake.take(PARKING)

    assert (report.taken, report.recorded) == (6, 6)
    assert queue_depths(url, ["saga.parking_lot"]) == {"saga.parking_lot": 0}
    rows = held(order_app, PARKING)
    assert [r["body"] for r in rows] == ["garbage"] * 6
    assert [r["headers"].get("note") for r in rows][4:] == ["a", "b"]
    assert order_app.intake.take(PARKING).taken == 0 and len(held(order_app, PARKING)) == 6


def test_a_parked_message_delivered_again_after_its_ack_was_lost_is_stored_once(
    order_app, settings, monkeypatch
):
    url, intake = settings.broker_url, order_app.intake
    park(url)
    park(url)  # its twin, never delivered before: a row of its own
    store = intake._store

    def store_then_die(*args, **kwargs):
        store(*args, **kwargs)
        raise Crash

    monkeypatch.setattr(intake, "_store", store_then_die)
    with pytest.raises(Crash):
        intake.take(PARKING)
    monkeypatch.undo()
    assert len(held(order_app, PARKING)) == 1, "stored, committed, not acked"
    assert queue_depths(url, ["saga.parking_lot"]) == {"saga.parking_lot": 2}

    report = intake.take(PARKING)

    assert (report.taken, report.recorded) == (2, 1), "the redelivery claims its own row"
    assert queue_depths(url, ["saga.parking_lot"]) == {"saga.parking_lot": 0}
    rows = held(order_app, PARKING)
    assert len(rows) == 2 and all(r["acked"] for r in rows)


def test_a_delivery_left_by_an_outage_is_not_taken_for_its_twin_stored_before(
    order_app, settings, monkeypatch
):
    """Twin one is stored and acked (marking the ack fails once: the database is away);
    twin two meets the outage and comes back flagged redelivered. The acked row is
    marked first and claims nothing: twin two is its own row."""
    url, intake = settings.broker_url, order_app.intake
    park(url)
    park(url)
    take_one, mark = intake._take, intake_module.held_sql.mark_acked
    calls = {"take": 0, "mark": 0}

    def outage_on_the_second(*args, **kwargs):
        calls["take"] += 1
        if calls["take"] == 2:
            raise OUTAGE
        return take_one(*args, **kwargs)

    def mark_fails_once(*args, **kwargs):
        calls["mark"] += 1
        if calls["mark"] == 1:
            raise OUTAGE
        return mark(*args, **kwargs)

    monkeypatch.setattr(intake, "_take", outage_on_the_second)
    monkeypatch.setattr(intake_module.held_sql, "mark_acked", mark_fails_once)
    with pytest.raises(ServiceUnavailable):
        intake.take(PARKING)
    monkeypatch.setattr(intake, "_take", take_one)
    (first,) = held(order_app, PARKING)
    assert not first["acked"], "its ack went through; marking it did not"
    assert queue_depths(url, ["saga.parking_lot"]) == {"saga.parking_lot": 1}

    report = intake.take(PARKING)

    assert (report.taken, report.recorded) == (1, 1)
    rows = held(order_app, PARKING)
    assert len(rows) == 2 and all(r["acked"] for r in rows)
    assert queue_depths(url, ["saga.parking_lot"]) == {"saga.parking_lot": 0}


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_delivery_key_is_the_same_when_rabbitmq_delivers_the_message_again(settings, queue_type):
    """What RabbitMQ changes on a redelivery (the flag; a quorum queue's
    x-delivery-count) is not in the key; every property and header is."""
    url, queue = settings.broker_url, f"edges.redeliver.{uuid.uuid4().hex[:6]}"
    with Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(
            queue=queue, durable=True, auto_delete=False, arguments={"x-queue-type": queue_type}
        )
        for message_id in ("m-1", "m-1", "m-2"):
            message = channel.prepare_message(
                GARBAGE, headers={"h": 1}, properties={"message_id": message_id}
            )
            channel.basic_publish(message, exchange="", routing_key=queue)
        channel.close()
    seen: list[RawMessage] = []

    def look(message: RawMessage) -> bool:
        seen.append(message)
        return False  # left unacked: back to the queue once the channel closes

    try:
        assert take(url, queue, look, limit=3) == 0
        assert take(url, queue, look, limit=3) == 0
    finally:
        with Connection(url) as conn:
            conn.channel().queue_delete(queue)
    first, second = seen[:3], seen[3:]
    assert [m.redelivered for m in seen] == [False] * 3 + [True] * 3
    if queue_type == "quorum":
        assert [m.headers.get("x-delivery-count") for m in second] == [1, 1, 1]
    keys = [intake_module.delivery_key(m) for m in first]
    assert [intake_module.delivery_key(m) for m in second] == keys
    assert keys[0] == keys[1] != keys[2], "alike in every byte, or not"
