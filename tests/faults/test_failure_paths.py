"""Failures by type through real TTL retry queues, the DLX, the parking lot and SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kombu import Connection

from saga_tasks.core.states import SagaStatus
from saga_tasks.ops.processes import Supervisor
from saga_tasks.testing import RabbitAdmin, wait_for, wait_for_status
from tests.helpers import ORDER, held, participant_db, rows, scalar


def published(isolation, queue):
    stats = (
        RabbitAdmin()._request("GET", f"/queues/{isolation.ident}/{queue}").get("message_stats")
        or {}
    )
    return int(stats.get("publish") or 0)


@pytest.mark.demo_faults
def test_a_transient_error_is_retried_through_the_tiers_then_succeeds(
    order_app, workers, isolation
):
    workers.orchestrator()
    inventory = workers.start("inventory", ["inventory.commands"])
    workers.start("others", ["orders.commands", "payments.commands"])
    handle = order_app.start_saga(
        "order", "tr-1", {**ORDER, "demo_faults": {"inventory.reserve": "transient:2"}}
    )
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
    log = inventory.log_text()
    assert "retry 1 of 3 in 1 s after TransientError" in log
    assert "retry 2 of 3 in 2 s after TransientError" in log
    # Both copies really went through their TTL queues (the management API counts them).
    wait_for(
        lambda: (
            published(isolation, "inventory.commands.retry.1s") == 1
            and published(isolation, "inventory.commands.retry.2s") == 1
        ),
        timeout=30,
        describe="the broker to count one publish on each retry queue",
    )
    assert published(isolation, "inventory.commands.retry.3s") == 0
    assert (
        scalar(participant_db(order_app, "inventory"), "SELECT count(*) FROM inventory.reservation")
        == 1
    )
    assert held(order_app) == []


@pytest.mark.demo_faults
def test_retries_spent_dead_letter_and_the_saga_compensates(order_app, workers):
    workers.orchestrator()
    workers.beat()
    workers.participants()
    handle = order_app.start_saga(
        "order", "tr-2", {**ORDER, "demo_faults": {"payments.authorize": "transient:9"}}
    )
    state = wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPENSATED], timeout=60)
    assert state.steps["authorize_payment"].given_up
    (dead,) = held(order_app)
    assert dead["reason"].startswith("retries exhausted (3) after TransientError")
    assert (dead["step"], dead["kind"], dead["original_queue"]) == (
        "authorize_payment",
        "command",
        "payments.commands",
    )
    # Dead-lettered once; its three retries are in the reason: not poison, replayable.
    assert dead["death_count"] == 1
    events = [
        r["event"]
        for r in rows(order_app.engine, "SELECT event FROM saga.saga_history ORDER BY id")
    ]
    assert "dead_lettered" in events
    payments = participant_db(order_app, "payments")
    assert scalar(payments, "SELECT count(*) FROM payments.authorization") == 0
    assert (
        scalar(
            payments,
            "SELECT kind FROM payments.command_ledger WHERE step = 'authorize_payment' AND kind <> 'compensation'",
        )
        == "tombstone"
    )
    assert (
        scalar(participant_db(order_app, "orders"), "SELECT status FROM orders.orders")
        == "CANCELLED"
    )


@pytest.mark.demo_faults
def test_an_unexpected_error_on_a_step_that_cannot_be_undone_needs_a_person(order_app, workers):
    workers.orchestrator()
    workers.beat()
    workers.participants()
    handle = order_app.start_saga(
        "order", "tr-3", {**ORDER, "demo_faults": {"orders.confirm": "raise"}}
    )
    state = wait_for_status(order_app, handle.saga_id, [SagaStatus.MANUAL_REVIEW], timeout=60)
    assert "confirm_order" in state.reason and "cannot be undone" in state.reason
    (dead,) = held(order_app)
    assert dead["reason"] == "retries exhausted (2) after RuntimeError"


@pytest.mark.demo_faults
def test_a_message_that_kills_its_worker_every_time_is_dead_lettered_after_the_bound(
    order_app, workers
):
    workers.orchestrator()
    workers.beat()
    workers.start("others", ["orders.commands", "payments.commands"])
    inventory = workers.start("inventory", ["inventory.commands"])
    supervisor = Supervisor([inventory])
    supervisor._watch = None
    # Restart the inventory worker whenever the poison kills it, like a process manager.
    import threading

    stop = threading.Event()

    def restart() -> None:
        while not stop.wait(0.2):
            if not inventory.alive():
                supervisor.restarts += 1
                inventory.start(wait=False)

    watcher = threading.Thread(target=restart, daemon=True)
    watcher.start()
    try:
        handle = order_app.start_saga(
            "order", "poison-1", {**ORDER, "demo_faults": {"inventory.reserve": "poison"}}
        )
        state = wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPENSATED], timeout=90)
    finally:
        stop.set()
        watcher.join()
    assert state.steps["reserve_stock"].given_up
    (dead,) = held(order_app)
    assert dead["reason"] == "poison: redelivered 3 times, its worker died each time"
    assert dead["death_count"] == 3
    # SAGA_POISON_LIMIT=2: the first delivery and two redeliveries killed it; the third was held.
    assert supervisor.restarts == 3
    assert (
        scalar(participant_db(order_app, "inventory"), "SELECT count(*) FROM inventory.reservation")
        == 0
    )


@pytest.mark.demo_faults
def test_a_poison_message_in_a_prefork_child_is_bounded_too(order_app, workers):
    workers.orchestrator()
    workers.beat()
    workers.start("others", ["orders.commands", "payments.commands"])
    workers.start("inventory", ["inventory.commands"], pool="prefork", concurrency=1)
    handle = order_app.start_saga(
        "order", "poison-2", {**ORDER, "demo_faults": {"inventory.reserve": "poison"}}
    )
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPENSATED], timeout=90)
    (dead,) = held(order_app)
    # Celery re-sends a task whose child was lost max_retries (3) times, then rejects it.
    assert dead["reason"] == (
        "poison: rejected by the broker after 3 re-sends for lost worker processes"
    )
    assert dead["death_count"] == 4


def test_an_unparseable_command_is_parked_and_listed(order_app, workers, isolation, settings):
    workers.start("orders", ["orders.commands"])
    workers.beat()
    workers.start("maintenance", ["saga.maintenance"])
    with Connection(settings.broker_url) as conn:
        channel = conn.channel()
        message = channel.prepare_message(
            b"{broken", content_type="application/json", content_encoding="utf-8",
            headers={"task": "orders.create", "id": "garbage-1"},
        )  # fmt: skip
        channel.basic_publish(
            message, exchange="saga.commands", routing_key="command.orders.create.v1"
        )
        channel.close()
    parked = wait_for(
        lambda: held(order_app, "parking"), timeout=30, describe="the message to be parked"
    )
    assert parked[0]["reason"].startswith("undecodable body")
    assert parked[0]["original_queue"] == "orders.commands"
    assert parked[0]["body"] == "{broken"
    result = subprocess.run(
        [sys.executable, "-m", "saga_tasks.ops.cli", "parking", "list", "--json"],
        env={**os.environ, **isolation.env(SAGA_TASKS_APP="participants.app:saga_app")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["messages"][0]["message_id"] == "garbage-1"
