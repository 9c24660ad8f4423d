"""Real workers, each with its own broker user and no permission to configure anything:
forged replies and a command routed by another participant change nothing but records,
and a participant's own retries and dead letters are believed as before.

The users come from ``saga-tasks broker users`` (the ``service_users`` fixture); the
permissions themselves are checked in ``tests/integration/test_broker_trust.py``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from amqp.exceptions import AccessRefused
from celery.utils.nodenames import gethostname
from kombu import Connection

from saga_tasks.core.messages import OutboundMessage, command_headers
from saga_tasks.core.states import MessageKind, SagaStatus, StepStatus
from saga_tasks.messaging.topology import retry_queue
from saga_tasks.runtime.holding import PARKING
from saga_tasks.testing import wait_for
from tests.helpers import (
    ORDER,
    forged_reply,
    held,
    participant_db,
    publish_as,
    reserve_command_id,
    rows,
    scalar,
)


def test_forged_replies_and_commands_change_nothing_and_workers_need_no_configure(
    service_users, workers
):
    """Real workers, each with its own user: forged replies (another participant's user,
    none at all) and a command routed by another participant through the retry exchange
    are recorded and parked and change nothing; the saga then completes, each effect once."""
    orchestrator = service_users.app("orchestrator")
    users = service_users
    for name, queues in (
        ("orchestrator", ["saga.replies", "saga.maintenance"]),
        ("orders", ["orders.commands"]),
    ):
        workers.start(name, queues, wait=False, env=users.worker_env(name))
    for worker in workers.started:
        worker.wait_ready()
    # A participant can neither take the orchestrator worker's remote-control messages nor
    # squat the queue name a restarted orchestrator worker would need.
    for action in (
        lambda ch: ch.basic_get(queue=f"orchestrator-1@{gethostname()}.celery.pidbox"),
        lambda ch: ch.queue_declare(
            queue=f"orchestrator-2@{gethostname()}.celery.pidbox", exclusive=True
        ),
    ):
        with Connection(users.url("orders")) as conn, pytest.raises(AccessRefused):
            action(conn.channel())
    handle = orchestrator.start_saga("order", "forged-replies", ORDER)
    saga_id = handle.saga_id

    def requested() -> Any:
        state = orchestrator.orchestrator.get(saga_id)
        return state if state.steps["reserve_stock"].status is StepStatus.REQUESTED else None

    before = wait_for(requested, timeout=60, describe="reserve_stock requested")
    command_id = reserve_command_id(orchestrator, saga_id)

    payments = service_users.app("payments")
    payments.publisher.publish([forged_reply(saga_id, command_id)])  # as payments
    service_users.app("orders").publisher.publish([forged_reply(saga_id, command_id)])
    anonymous = forged_reply(saga_id, command_id)
    headers = {**anonymous.headers, "task": "saga_tasks.reply", "id": anonymous.message_id}
    publish_as(users.url("payments"), "saga.replies", "reply.saga.v1", headers, anonymous.body)
    # A command for the inventory participant, routed by payments through a retry tier.
    sneaked = str(uuid.uuid4())
    tier = retry_queue("inventory.commands", 1)
    payments.publisher.publish(
        [
            OutboundMessage(
                message_id=str(uuid.uuid4()),
                task_name="inventory.reserve",
                queue=tier,
                routing_key=tier,
                saga_id=saga_id,
                headers=command_headers(
                    saga_id=saga_id,
                    saga_type="order",
                    step="reserve_stock",
                    kind=MessageKind.COMMAND,
                    command_id=sneaked,
                    attempt=1,
                    correlation_id=saga_id,
                    causation_id=None,
                    compensates=None,
                    traceparent=None,
                ),
                body={"saga_payload": ORDER, "results": {}},
            )
        ]
    )

    def invalid(consumer: str) -> list[dict[str, Any]]:
        return rows(
            orchestrator.engine,
            "SELECT * FROM saga.invalid_message WHERE consumer = :c ORDER BY id",
            c=consumer,
        )

    def three() -> Any:
        found = invalid("orchestrator")
        return len(found) == 3 and found

    refused_replies = wait_for(three, timeout=30, describe="three replies refused")
    only = f"only {users.user('inventory')!r} or {users.user('orchestrator')!r} may send it"
    assert sorted(r["reason"] for r in refused_replies) == sorted(
        [
            f"reply for step 'reserve_stock' from broker user {users.user(s)!r}; {only}"
            for s in ("orders", "payments")
        ]
        + ["reply names no sender (no AMQP user_id): not authenticated"]
    )
    after = orchestrator.orchestrator.get(saga_id)
    assert (after.status, after.version) == (SagaStatus.RUNNING, before.version)
    assert after.steps["reserve_stock"].status is StepStatus.REQUESTED
    ids = [r["message_id"] for r in refused_replies]
    inbox = "SELECT count(*) FROM saga.inbox WHERE message_id = ANY(:ids)"
    assert scalar(orchestrator.engine, inbox, ids=ids) == 0

    # The participants' workers, with no permission to configure anything, run the saga.
    for name in ("inventory", "payments"):
        workers.start(name, [f"{name}.commands"], wait=False, env=users.worker_env(name))
    for worker in workers.started[2:]:
        worker.wait_ready()

    def completed() -> Any:
        state = orchestrator.orchestrator.get(saga_id)
        return state.status is SagaStatus.COMPLETED and state

    wait_for(completed, timeout=90, describe="saga completed")
    inventory = participant_db(orchestrator, "inventory")
    assert scalar(inventory, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 2
    ledger = "SELECT count(*) FROM inventory.command_ledger WHERE command_id = :c"
    assert scalar(inventory, ledger, c=sneaked) == 0

    # Parked, each with its reason: the three replies by the orchestrator, the command by
    # inventory (each the service that refused it, so attested).
    def parked() -> Any:
        orchestrator.intake.take(PARKING)
        found = held(orchestrator, PARKING)
        return len(found) == 4 and found

    found = wait_for(parked, timeout=30, describe="four parked messages")
    assert {h["published_by"] for h in found} == {
        service_users.user("orchestrator"),
        service_users.user("inventory"),
    }
    assert all(h["attested"] for h in found)
    # The sneaked command, refused by inventory (its database holds no saga tables: the
    # orchestrator's intake keeps the parked copy with the reason).
    (sneaked_refusal,) = [h for h in found if h["published_by"] == users.user("inventory")]
    assert (
        f"command for inventory.reserve from broker user {users.user('payments')!r}; {only}"
        in sneaked_refusal["reason"]
    )
    for worker in workers.started:
        log = worker.log_text()
        assert "ACCESS_REFUSED" not in log and "Traceback" not in log, worker.name


@pytest.mark.demo_faults
def test_a_participants_own_retries_and_dead_letters_are_believed(service_users, workers):
    """Its retry copies come back to it as its own (accepted), and its dead letter of its
    own step is attested: the saga compensates, as with one shared user. Beat and the
    intake run as the orchestrator's user."""
    orchestrator = service_users.app("orchestrator")
    for name, queues in (
        ("orchestrator", ["saga.replies", "saga.maintenance"]),
        ("orders", ["orders.commands"]),
        ("inventory", ["inventory.commands"]),
        ("payments", ["payments.commands"]),
    ):
        workers.start(name, queues, wait=False, env=service_users.worker_env(name))
    workers.beat(env=service_users.worker_env("orchestrator"))
    for worker in workers.started:
        worker.wait_ready()
    retried = orchestrator.start_saga(
        "order", "own-retry", {**ORDER, "demo_faults": {"inventory.reserve": "transient:1"}}
    )
    dead = orchestrator.start_saga(
        "order", "own-dead", {**ORDER, "demo_faults": {"inventory.reserve": "raise"}}
    )

    def ended() -> Any:
        statuses = [orchestrator.orchestrator.get(h.saga_id).status for h in (retried, dead)]
        return statuses == [SagaStatus.COMPLETED, SagaStatus.COMPENSATED] and statuses

    wait_for(ended, timeout=45, describe="one saga completed after a retry, one compensated")
    (letter,) = held(orchestrator)
    assert (letter["attested"], letter["published_by"]) == (True, service_users.user("inventory"))
    assert letter["reason"].startswith("retries exhausted (2) after")
    assert rows(orchestrator.engine, "SELECT * FROM saga.invalid_message") == []
