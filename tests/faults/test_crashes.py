"""Processes killed with SIGKILL at the worst moments; the sagas still finish, once."""

from __future__ import annotations

import signal

import pytest

from saga_tasks.core.states import TERMINAL_SAGA, SagaStatus
from saga_tasks.testing import queue_depths, wait_for
from tests.helpers import ORDER, assert_each_effect_once, participant_db, rows, scalar, statuses

PARTICIPANT_QUEUES = ["orders.commands", "inventory.commands", "payments.commands"]


@pytest.mark.demo_faults
@pytest.mark.timeout(180)  # 30 sagas through a kill and a restart, two tests at a time
def test_orchestrator_killed_mid_saga_and_restarted(order_app, workers):
    sagas = 30
    orchestrator = workers.orchestrator(pool="prefork", concurrency=2)
    # Beat too: a kill between a commit and its publish leaves rows only recovery sends.
    workers.beat()
    workers.participants()
    payload = {**ORDER, "demo_faults": {"payments.authorize": "slow:0.1"}}
    handles = [order_app.start_saga("order", f"k-{i}", payload) for i in range(sagas)]

    def mid_flight() -> bool:
        done = scalar(
            order_app.engine, "SELECT count(*) FROM saga.saga_step WHERE status = 'SUCCEEDED'"
        )
        return done >= sagas  # about a quarter of all steps have succeeded

    wait_for(mid_flight, timeout=60, describe="sagas half-way")
    orchestrator.kill(signal.SIGKILL)
    running = statuses(order_app).get("RUNNING", 0)
    assert running > 0, "the orchestrator was killed after every saga had finished"

    workers.orchestrator(pool="prefork", concurrency=2)
    wait_for(
        lambda: statuses(order_app) == {"COMPLETED": sagas},
        timeout=120,
        describe=lambda: f"every saga COMPLETED (now {statuses(order_app)})",
    )
    assert_each_effect_once(order_app, sagas)
    assert {h.saga_id for h in handles} == {
        r["saga_id"] for r in rows(order_app.engine, "SELECT saga_id::text FROM saga.saga_instance")
    }


@pytest.mark.demo_faults
def test_participant_killed_after_commit_reply_recovered_from_outbox(order_app, workers, settings):
    """The reply a participant committed and never published is republished by its own
    worker's outbox recovery once the service is back (its database and broker user are
    its own: nobody else can)."""
    workers.orchestrator()
    workers.beat()
    workers.start("orders", ["orders.commands"])
    workers.start("payments", ["payments.commands"])
    inventory = workers.start("inventory", ["inventory.commands"])
    payload = {**ORDER, "demo_faults": {"inventory.reserve": "crash_after_commit"}}
    handle = order_app.start_saga("order", "crash-1", payload)

    wait_for(
        lambda: not inventory.alive(), timeout=30, describe="the inventory worker to kill itself"
    )
    # Committed: the reservation and the reply in the outbox; published: nothing.
    assert (
        scalar(participant_db(order_app, "inventory"), "SELECT count(*) FROM inventory.reservation")
        == 1
    )
    # Old enough for recovery (SAGA_RELAY_MIN_AGE=1) before the service is back, so its
    # first recovery pass (before it takes a message) is what publishes the reply.
    wait_for(
        lambda: scalar(
            participant_db(order_app, "inventory"),
            "SELECT count(*) FROM inventory.outbox WHERE created_at < now() - interval '2 s'",
        ),
        timeout=10,
        describe="the unpublished reply to be old enough for recovery",
    )
    restarted = workers.start("inventory-again", ["inventory.commands"])
    state = wait_for(
        lambda: (s := order_app.orchestrator.get(handle.saga_id)).status in TERMINAL_SAGA and s,
        timeout=60,
        describe="the saga to finish once the inventory service is back",
    )
    assert state.status is SagaStatus.COMPLETED
    assert not inventory.alive()
    outbox = rows(
        participant_db(order_app, "inventory"),
        "SELECT published_at, recovered FROM inventory.outbox",
    )
    assert len(outbox) == 1 and outbox[0]["published_at"] is not None
    assert outbox[0]["recovered"] is True, "published by recovery, not by the dead worker"
    assert "outbox recovery published 1 of 1 rows from inventory.outbox" in restarted.log_text()

    # The reserve command was never acked: the new inventory worker gets it again (after
    # its recovery pass, which runs before it takes a message), finds it in the ledger,
    # re-sends the stored reply and changes nothing.
    wait_for(
        lambda: (
            queue_depths(settings.broker_url, ["inventory.commands"])["inventory.commands"] == 0
            and scalar(
                order_app.engine,
                "SELECT count(*) FROM saga.saga_history WHERE event = 'duplicate_message'",
            )
        ),
        timeout=30,
        describe="the redelivered command to be answered from the ledger",
    )
    assert_each_effect_once(order_app, 1)


def test_database_away_requeues_replies_and_loses_nothing(order_app, workers, isolation):
    missing = isolation.database_url.rsplit("/", 1)[0] + "/saga_no_such_database"
    cut_off = workers.orchestrator(env={"SAGA_DATABASE_URL": missing})
    workers.participants()
    handle = order_app.start_saga("order", "outage-1", ORDER)
    wait_for(
        lambda: "the message comes back in" in cut_off.log_text(),
        timeout=30,
        describe="the orchestrator without its database to requeue the reply",
    )
    assert "cannot reach PostgreSQL at" in cut_off.log_text()
    assert order_app.orchestrator.get(handle.saga_id).version == 1
    cut_off.stop()
    workers.orchestrator()
    wait_for(
        lambda: order_app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED,
        timeout=30,
        describe="the saga to complete once a worker reaches the database",
    )
    assert_each_effect_once(order_app, 1)
    # An outage is nobody's message's fault: nothing was dead-lettered for it.
    assert queue_depths(isolation.broker_url, ["saga.dead_letter"]) == {"saga.dead_letter": 0}


@pytest.mark.demo_faults
def test_participant_killed_before_commit_leaves_nothing_and_runs_again(order_app, workers):
    workers.orchestrator()
    workers.start("orders", ["orders.commands"])
    workers.start("inventory", ["inventory.commands"])
    payments = workers.start("payments", ["payments.commands"])
    payload = {**ORDER, "demo_faults": {"payments.authorize": "crash_before_commit"}}
    handle = order_app.start_saga("order", "crash-2", payload)
    wait_for(lambda: not payments.alive(), timeout=30, describe="the payments worker to die")
    # Died inside its transaction: no authorization, no ledger row, no reply.
    for table in ("payments.authorization", "payments.command_ledger", "payments.outbox"):
        assert scalar(participant_db(order_app, "payments"), f"SELECT count(*) FROM {table}") == 0
    workers.start("payments", ["payments.commands"])  # the unacked command comes back
    state = wait_for(
        lambda: (s := order_app.orchestrator.get(handle.saga_id)).status in TERMINAL_SAGA and s,
        timeout=60,
        describe="the saga to finish once payments is back",
    )
    assert state.status is SagaStatus.COMPLETED
    assert_each_effect_once(order_app, 1)
    assert scalar(participant_db(order_app, "payments"), "SELECT authorized_cents FROM payments.customer "
                  "WHERE customer_id = 'c-1'") == ORDER["amount_cents"]  # fmt: skip
