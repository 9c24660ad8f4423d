"""Overload with real workers: a burst far longer than a step's timeout, and a step that
cannot be undone answering long after its timeout, end as their paths say, without
re-sends storms and without a person."""

from __future__ import annotations

import pytest

from saga_tasks.core.states import SagaStatus
from saga_tasks.messaging.admin import queue_depths
from saga_tasks.testing import wait_for, wait_for_status
from tests.helpers import ORDER, build_order_app, rows, scalar, statuses

BURST_SCALE = 0.1
"""Order saga timeouts in the burst: create 3 s, authorize 6 s, the saga 60 s."""


@pytest.fixture
def burst_app(settings, workers):
    workers.time_scale = BURST_SCALE
    app = build_order_app(settings, time_scale=BURST_SCALE)
    yield app
    app.close()


def count(app, event):
    return scalar(app.engine, "SELECT count(*) FROM saga.saga_history WHERE event = :e", e=event)


@pytest.mark.timeout(300)  # the burst may take its 240 s, and stopping its workers more
def test_a_burst_many_step_timeouts_long_ends_as_each_path_says(burst_app, workers):
    """Default flow control and retry policies; one worker per role, as a small
    deployment. The burst takes several step timeouts to work through: commands wait in
    PostgreSQL for their queue's room, their deadlines run from dispatch, so no good
    order is compensated, none is sent again for being queued, none needs a person."""
    app = burst_app
    workers.orchestrator()
    workers.beat()
    workers.participants()
    good, empty = 270, 30
    for i in range(good):
        sku = f"sku-{1 + i % 10}"
        app.start_saga("order", f"b-{i}", {**ORDER, "items": [{"sku": sku, "qty": 1}]})
    for i in range(empty):
        app.start_saga("order", f"e-{i}", {**ORDER, "items": [{"sku": "sku-empty", "qty": 1}]})
    queues = ["orders.commands", "inventory.commands", "payments.commands"]
    deepest = dict.fromkeys(queues, 0)

    def ended() -> bool:
        for queue, depth in queue_depths(app.settings.broker_url, queues).items():
            deepest[queue] = max(deepest[queue], depth)
        return sum(statuses(app).get(s, 0) for s in ("RUNNING", "COMPENSATING")) == 0

    wait_for(ended, timeout=240, describe="every saga of the burst to end")
    # The backlog waited in PostgreSQL: the broker never held more than a queue's limit.
    assert all(depth <= 32 for depth in deepest.values()), deepest
    assert statuses(app) == {"COMPLETED": good, "COMPENSATED": empty}
    reasons = {
        r["status_reason"]
        for r in rows(
            app.engine, "SELECT status_reason FROM saga.saga_instance WHERE status = 'COMPENSATED'"
        )
    }
    assert all("out_of_stock" in (r or "") for r in reasons), reasons
    took = scalar(
        app.engine,
        "SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM saga.saga_instance",
    )
    assert took > 3, f"the burst took {took:.1f} s: not longer than a step timeout"
    resent = count(app, "step_resent") + count(app, "compensation_resent")
    assert resent <= (good + empty) // 20, f"{resent} re-sends for a burst with no fault"


@pytest.mark.demo_faults
@pytest.mark.timeout(180)  # a 20 s step, awaited up to 60 s, on a machine that may be busy
def test_a_slow_step_that_cannot_be_undone_completes_past_the_sagas_deadline(fast_app, workers):
    """confirm_order (no compensation, 0.9 s timeout) takes 20 s, beyond the saga's own
    18 s deadline: it is sent again until it answers and the saga completes; nothing is
    compensated and no person is asked."""
    workers.orchestrator()
    workers.beat()
    workers.participants()
    payload = {**ORDER, "demo_faults": {"orders.confirm": "slow:20"}}
    handle = fast_app.start_saga("order", "slow-confirm", payload)
    state = wait_for_status(
        fast_app, handle.saga_id, [SagaStatus.COMPLETED, SagaStatus.MANUAL_REVIEW], timeout=60
    )
    assert state.status is SagaStatus.COMPLETED, state.reason
    events = [
        r["event"]
        for r in rows(
            fast_app.engine,
            "SELECT event FROM saga.saga_history WHERE saga_id = :s ORDER BY id",
            s=handle.saga_id,
        )
    ]
    assert "deadline_passed_forward" in events
    assert "manual_review" not in events and "compensation_started" not in events
