"""The order saga through real worker processes, RabbitMQ and PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest
from kombu import Connection

from saga_tasks.core.states import SagaStatus
from saga_tasks.testing import queue_depths, wait_for, wait_for_status
from tests.helpers import ORDER, participant_db, reserved, rows, scalar


def test_happy_path(order_app, workers):
    workers.orchestrator()
    workers.participants()
    handle = order_app.start_saga("order", "e-1", ORDER)
    state = wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED])
    assert [s.status.value for s in state.steps.values()] == ["SUCCEEDED"] * 4
    assert (
        scalar(
            participant_db(order_app, "orders"),
            "SELECT status FROM orders.orders WHERE saga_id = :s",
            s=handle.saga_id,
        )
        == "CONFIRMED"
    )
    assert reserved(order_app, "sku-1") == 2
    assert (
        scalar(participant_db(order_app, "payments"), "SELECT status FROM payments.authorization")
        == "AUTHORIZED"
    )
    assert state.steps["create_order"].result["order_id"]


def test_stock_failure_cancels_the_order(order_app, workers):
    workers.orchestrator()
    workers.participants()
    handle = order_app.start_saga(
        "order", "e-2", {**ORDER, "items": [{"sku": "sku-scarce", "qty": 5}]}
    )
    state = wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPENSATED])
    assert state.steps["reserve_stock"].error == "out_of_stock"
    assert state.steps["create_order"].status.value == "COMPENSATED"
    assert state.steps["authorize_payment"].status.value == "SKIPPED"
    assert (
        scalar(participant_db(order_app, "orders"), "SELECT status FROM orders.orders")
        == "CANCELLED"
    )
    assert reserved(order_app, "sku-scarce") == 0


def test_payment_declined_releases_stock_and_cancels_the_order(order_app, workers):
    workers.orchestrator()
    workers.participants()
    handle = order_app.start_saga("order", "e-3", {**ORDER, "customer_id": "c-low"})
    state = wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPENSATED])
    assert state.steps["authorize_payment"].error == "declined"
    assert [s.status.value for s in state.steps.values()] == [
        "COMPENSATED",
        "COMPENSATED",
        "FAILED",
        "SKIPPED",
    ]
    engine = order_app.engine
    assert reserved(order_app, "sku-1") == 0
    assert (
        scalar(participant_db(order_app, "inventory"), "SELECT status FROM inventory.reservation")
        == "RELEASED"
    )
    assert (
        scalar(participant_db(order_app, "orders"), "SELECT status FROM orders.orders")
        == "CANCELLED"
    )
    events = [h["event"] for h in rows(engine, "SELECT event FROM saga.saga_history ORDER BY id")]
    assert events.index("compensation_started") < events.index("saga_compensated")


def test_same_business_key_started_twice_is_one_saga(order_app, workers):
    workers.orchestrator()
    workers.participants()
    first = order_app.start_saga("order", "e-4", ORDER)
    wait_for_status(order_app, first.saga_id, [SagaStatus.COMPLETED])
    second = order_app.start_saga("order", "e-4", ORDER)
    assert second.saga_id == first.saga_id and not second.created
    assert second.status is SagaStatus.COMPLETED
    assert scalar(participant_db(order_app, "orders"), "SELECT count(*) FROM orders.orders") == 1
    assert reserved(order_app, "sku-1") == 2


@pytest.mark.demo_faults
def test_a_reply_delivered_twice_makes_one_transition(order_app, workers):
    workers.orchestrator()
    workers.participants()
    payload = {**ORDER, "demo_faults": {"inventory.reserve": "duplicate_reply"}}
    handle = order_app.start_saga("order", "e-5", payload)
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED])
    history = wait_for(
        lambda: (
            (h := rows(order_app.engine, "SELECT event, step FROM saga.saga_history ORDER BY id"))
            and any(e["event"] == "duplicate_message" for e in h)
            and h
        ),
        describe="the duplicate reply to be recorded",
    )
    succeeded = [
        h for h in history if h["event"] == "step_succeeded" and h["step"] == "reserve_stock"
    ]
    assert len(succeeded) == 1
    assert order_app.orchestrator.get(handle.saga_id).version == 5  # start + one per step


def test_a_command_delivered_twice_has_one_effect(order_app, workers):
    workers.orchestrator()
    workers.participants()
    handle = order_app.start_saga("order", "e-6", ORDER)
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED])
    # Deliver the reserve command again, exactly as it was first published.
    from sqlalchemy import select

    from saga_tasks.persistence import outbox
    from saga_tasks.persistence.tables import saga_outbox

    with order_app.engine.connect() as conn:
        row = conn.execute(
            select(saga_outbox).where(saga_outbox.c.task_name == "inventory.reserve")
        ).one()
    result = order_app.publisher.publish([outbox.to_message(row)])
    assert result.published
    wait_for(
        lambda: scalar(
            order_app.engine,
            "SELECT count(*) FROM saga.saga_history WHERE event = 'duplicate_message'",
        ),
        describe="the re-sent stored reply to reach the orchestrator",
    )
    assert (
        scalar(participant_db(order_app, "inventory"), "SELECT count(*) FROM inventory.reservation")
        == 1
    )
    assert reserved(order_app, "sku-1") == 2
    assert (
        scalar(
            participant_db(order_app, "inventory"), "SELECT count(*) FROM inventory.command_ledger"
        )
        == 1
    )
    assert order_app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED


def test_messages_that_make_no_sense_are_recorded_and_the_worker_lives_on(
    order_app, workers, settings
):
    orchestrator = workers.orchestrator()
    workers.participants()
    exchange, key = "saga.replies", "reply.saga.v1"
    unknown_saga = str(uuid.uuid4())
    good_body = json.dumps([[], {"outcome": "success"}, {}])
    with Connection(settings.broker_url) as conn:
        channel = conn.channel()

        def send(body: str | bytes, headers: dict, content_type: str = "application/json") -> None:
            message = channel.prepare_message(
                body, content_type=content_type, content_encoding="utf-8", headers=headers
            )
            channel.basic_publish(message, exchange=exchange, routing_key=key)

        send(b"{not json", {"task": "saga_tasks.reply", "id": "m-garbage"})
        send(good_body, {"task": "saga_tasks.unknown", "id": "m-unknown-task"})
        send(good_body, {"id": "m-no-task"})
        send(good_body, {"task": "saga_tasks.reply", "id": "m-no-headers"})
        send(
            good_body,
            {
                "task": "saga_tasks.reply",
                "id": "m-unknown-saga",
                "saga_id": unknown_saga,
                "saga_step": "create_order",
                "saga_message_kind": "reply",
                "saga_reply_to_kind": "command",
                "saga_command_id": unknown_saga,
            },
        )
        send(
            b"\x00\x01binary",
            {"task": "saga_tasks.reply", "id": "m-binary"},
            content_type="application/x-python-serialize",
        )
        channel.close()

    recorded = wait_for(
        lambda: (
            r
            if len(
                r := rows(order_app.engine, "SELECT message_id, reason FROM saga.invalid_message")
            )
            >= 6
            else None
        ),
        describe="six invalid messages recorded",
    )
    reasons = {r["message_id"]: r["reason"] for r in recorded}
    assert reasons["m-garbage"].startswith("undecodable body")
    assert reasons["m-unknown-task"] == "unknown task 'saga_tasks.unknown'"
    assert reasons["m-no-task"].startswith("not a task message")
    assert reasons["m-no-headers"] == "missing or empty header 'saga_id'"
    assert reasons["m-unknown-saga"] == f"reply for unknown saga {unknown_saga}"
    assert reasons["m-binary"].startswith("undecodable body")
    bodies = rows(
        order_app.engine, "SELECT body_sha256, body_size, headers FROM saga.invalid_message"
    )
    assert all(b["body_sha256"] and b["body_size"] for b in bodies)
    assert queue_depths(
        settings.broker_url, ["saga.replies", "saga.dead_letter", "saga.parking_lot"]
    ) == {
        "saga.replies": 0,
        "saga.dead_letter": 0,
        "saga.parking_lot": 6,
    }
    assert orchestrator.alive()
    handle = order_app.start_saga("order", "e-7", ORDER)
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED])
