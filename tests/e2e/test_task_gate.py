"""A queue runs only the tasks that belong on it, and no message makes a worker publish on
its behalf: real workers, each with its own broker user, and messages a participant
(payments) may publish, each of which would otherwise have made another service's worker
do its bidding under that service's name.

Each message carries a command id of its own; it is handled when it is parked or when
its effect shows (a row in inventory's ledger, a status sample): the test waits for
either, then asserts that none had an effect.
"""

from __future__ import annotations

import uuid
from typing import Any

from saga_tasks.core.messages import REPLY_TASK, command_headers
from saga_tasks.core.states import MessageKind
from saga_tasks.messaging.topology import REPLY_ROUTING_KEY as REPLY_KEY
from saga_tasks.messaging.topology import retry_queue
from saga_tasks.runtime.holding import PARKING
from saga_tasks.testing import wait_for
from tests.helpers import ORDER, held, participant_db, publish_task, rows, scalar


def _reserve(command_id: str, *, queue: str = "inventory.commands") -> dict[str, Any]:
    """A signature of inventory's reserve for a saga nobody started, as Celery's canvas
    writes one into a message's chain or callbacks."""
    saga_id = str(uuid.uuid4())
    headers = command_headers(
        saga_id=saga_id,
        saga_type="order",
        step="reserve_stock",
        kind=MessageKind.COMMAND,
        command_id=command_id,
        attempt=1,
        correlation_id=saga_id,
        causation_id=None,
        compensates=None,
        traceparent=None,
    )
    return {
        "task": "inventory.reserve",
        "args": [],
        "kwargs": {"saga_payload": ORDER, "results": {}},
        "options": {"queue": queue, "task_id": str(uuid.uuid4()), "headers": dict(headers)},
        "subtask_type": None,
        "immutable": True,
    }


def test_no_message_makes_a_worker_run_what_is_not_its_own_or_publish_for_it(
    service_users, workers
):
    users = service_users
    orchestrator = users.app("orchestrator")
    for name, queues in (
        ("orchestrator", ["saga.replies", "saga.maintenance"]),
        ("inventory", ["inventory.commands"]),
    ):
        workers.start(name, queues, wait=False, env=users.worker_env(name))
    for worker in workers.started:
        worker.wait_ready()
    orchestrator.start_saga("order", "gate", ORDER)  # something for a status sample to count
    payments = users.url("payments")
    ids = {name: str(uuid.uuid4()) for name in ("chain", "callback", "retry_tier", "direct")}
    no_more = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

    sent: list[str] = []
    # Celery's own task on the reply queue, with a chain into inventory's queue: the
    # orchestrator's worker would publish the reserve as the orchestrator.
    chain = {**no_more, "chain": [_reserve(ids["chain"])]}
    sent.append(
        publish_task(payments, "saga.replies", REPLY_KEY, "celery.accumulate", [[1], {}, chain])
    )
    # The reply task itself, with a callback: it would run (and refuse the reply), then
    # the callback would go out as the orchestrator.
    callback = {**no_more, "callbacks": [_reserve(ids["callback"])]}
    saga_id = str(uuid.uuid4())
    body = [[], {"outcome": "success"}, callback]
    sent.append(
        publish_task(payments, "saga.replies", REPLY_KEY, REPLY_TASK, body, saga_id=saga_id)
    )
    # Through inventory's retry tier: inventory's own worker would send the chain on as
    # inventory, to its own queue, where a command from itself is believed.
    tier = retry_queue("inventory.commands", 1)
    chain = {**no_more, "chain": [_reserve(ids["retry_tier"])]}
    sent.append(publish_task(payments, "saga.retry", tier, "celery.accumulate", [[1], {}, chain]))
    # A maintenance task and another participant's handler on the reply queue.
    body = [[], {}, no_more]
    sent.append(publish_task(payments, "saga.replies", REPLY_KEY, "saga_tasks.sample_status", body))
    restock = _reserve(ids["direct"])
    body = [[], restock["kwargs"], no_more]
    headers = restock["options"]["headers"]
    sent.append(
        publish_task(payments, "saga.replies", REPLY_KEY, "inventory.restock", body, **headers)
    )

    inventory = participant_db(orchestrator, "inventory")
    ledger = "SELECT count(*) FROM inventory.command_ledger WHERE command_id = :c"
    sampled = "SELECT count(*) FROM saga.status_sample"

    def effects() -> dict[str, int]:
        found = {name: scalar(inventory, ledger, c=c) for name, c in ids.items()}
        found["sample_status"] = scalar(orchestrator.engine, sampled)
        return found

    def handled() -> Any:
        orchestrator.intake.take(PARKING)
        parked = [h for h in held(orchestrator, PARKING) if h["message_id"] in sent]
        done = len(parked) + sum(1 for n in effects().values() if n)
        return done >= len(sent) and parked

    parked = wait_for(handled, timeout=60, describe="five messages parked or run")
    assert effects() == dict.fromkeys([*ids, "sample_status"], 0)
    reasons = sorted(h["reason"] for h in parked)
    assert len(reasons) == 5, reasons
    assert sum("task 'celery.accumulate' does not run on saga.replies" in r for r in reasons) == 1
    assert sum("task 'celery.accumulate' does not run on inventory.commands" in r
               for r in reasons) == 1  # fmt: skip
    assert any("asks for follow-up work (callbacks)" in r for r in reasons)
    assert any(
        "task 'saga_tasks.sample_status' does not run on saga.replies "
        "(it runs on saga.maintenance)" in r
        for r in reasons
    )
    assert any(
        "task 'inventory.restock' does not run on saga.replies (it runs on inventory.commands)" in r
        for r in reasons
    )
    # Parked by the worker that refused it, naming who sent it.
    assert {h["published_by"] for h in parked} == {
        users.user("orchestrator"),
        users.user("inventory"),
    }
    assert all(h["original_queue"] in ("saga.replies", "inventory.commands") for h in parked)
    # The orchestrator's records (a participant's database holds no saga tables).
    invalid = rows(orchestrator.engine, "SELECT reason FROM saga.invalid_message")
    assert sum(r["reason"].startswith("refused: ") for r in invalid) == 4
    logs = "".join(worker.log_text() for worker in workers.started)
    assert logs.count("message refused by the task gate") == 5
    for worker in workers.started:
        assert "Traceback" not in worker.log_text(), worker.name
