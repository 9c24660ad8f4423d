"""A lost pool child under per-service broker users: Celery re-sends the task as the
participant's own user, which may publish commands only with its own routing keys; the
re-sends are believed (its own), and the last one, dead-lettered, is attested."""

from __future__ import annotations

from typing import Any

import pytest

from saga_tasks.core.states import SagaStatus
from saga_tasks.runtime.holding import DEAD_LETTER
from saga_tasks.testing import wait_for
from tests.helpers import ORDER, held, rows


@pytest.mark.demo_faults
def test_a_poison_message_in_a_prefork_child_is_re_sent_as_its_participant(service_users, workers):
    users = service_users
    orchestrator = users.app("orchestrator")
    for name, queues, pool in (
        ("orchestrator", ["saga.replies", "saga.maintenance"], "solo"),
        ("orders", ["orders.commands"], "solo"),
        ("inventory", ["inventory.commands"], "prefork"),
    ):
        workers.start(name, queues, pool=pool, wait=False, env=users.worker_env(name))
    for worker in workers.started:
        worker.wait_ready()
    handle = orchestrator.start_saga(
        "order", "poison-users", {**ORDER, "demo_faults": {"inventory.reserve": "poison"}}
    )

    def compensated() -> Any:
        orchestrator.intake.take(DEAD_LETTER)
        state = orchestrator.orchestrator.get(handle.saga_id)
        return state.status is SagaStatus.COMPENSATED and state

    wait_for(compensated, timeout=90, describe="the saga compensated")
    (dead,) = held(orchestrator)
    assert dead["reason"] == (
        "poison: rejected by the broker after 3 re-sends for lost worker processes"
    )
    assert (dead["attested"], dead["published_by"]) == (True, users.user("inventory"))
    assert rows(orchestrator.engine, "SELECT * FROM saga.invalid_message") == []
    assert "ACCESS_REFUSED" not in workers.started[2].log_text()
