"""The returns saga through real worker processes, RabbitMQ and PostgreSQL: each path
of its branch, its pivot and its person in the loop."""

from __future__ import annotations

import json

import pytest

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.testing import wait_for, wait_for_status
from tests.helpers import TIME_SCALE, build_order_app, participant_db, rows, saga_cli, scalar

RETURN = {
    "return_id": "ret-1",
    "order_ref": "ord-1",
    "customer_id": "c-1",
    "sku": "sku-1",
    "qty": 2,
    "amount_cents": 1999,
}
INSPECTION = 4.0
"""Seconds the inspector has in these tests; the escalation comes at two thirds."""


@pytest.fixture
def returns_app(settings, workers, request):
    workers.time_scale = TIME_SCALE
    workers.extra = {"RETURN_INSPECTION_SECONDS": str(INSPECTION)}
    app = build_order_app(
        settings,
        time_scale=TIME_SCALE,
        inspection=INSPECTION,
        faults=request.node.get_closest_marker("demo_faults") is not None,
    )
    yield app
    app.close()


def _start(app, workers, key: str, **changes):
    workers.orchestrator()
    workers.participants()
    handle = app.start_saga("return", key, {**RETURN, "return_id": key, **changes})
    wait_for(
        lambda: (
            app.orchestrator.get(handle.saga_id).steps["inspect"].status is StepStatus.REQUESTED
        ),
        timeout=30,
        describe="the return to wait for its inspection",
    )
    return handle.saga_id


def _one(app, participant: str, sql: str, **params):
    return scalar(participant_db(app, participant), sql, **params)


def _on_hand(app) -> int:
    return _one(app, "inventory", "SELECT on_hand FROM inventory.stock WHERE sku = 'sku-1'")


def test_accepted_return_is_refunded_restocked_and_notified(returns_app, workers, isolation):
    app = returns_app
    before = _on_hand(app)
    saga_id = _start(app, workers, "ret-ok")
    waiting = app.orchestrator.get(saga_id)
    env = workers.env()
    bad = saga_cli("signal", saga_id, "inspect", "--data", '{"decision": "maybe"}',
                   "--actor", "ines", "--reason", "looked at it", env=env)  # fmt: skip
    assert bad.returncode == 2 and "decision" in bad.stderr
    assert app.orchestrator.get(saga_id).version == waiting.version, "bad data changes nothing"
    good = saga_cli("signal", saga_id, "inspect", "--data", '{"decision": "accepted"}',
                    "--actor", "ines", "--reason", "as new", "--json", env=env)  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["saga_id"] == saga_id
    state = wait_for_status(app, saga_id, [SagaStatus.COMPLETED])
    assert state.steps["send_back"].not_taken and state.steps["close_rejected"].not_taken
    assert state.steps["inspect"].result == {"decision": "accepted", "note_ref": None}
    assert _one(app, "payments", "SELECT status FROM payments.refund") == "REQUESTED"
    assert _one(app, "inventory", "SELECT status FROM inventory.returned_item") == "RESTOCKED"
    assert _on_hand(app) == before + 2
    assert _one(app, "returns", "SELECT status FROM returns.return_request") == "REFUNDED"
    history = rows(app.engine, "SELECT event, actor FROM saga.saga_history WHERE saga_id = :s "
                   "ORDER BY id", s=saga_id)  # fmt: skip
    assert {"event": "step_signalled", "actor": "ines"} in history
    assert {h["event"] for h in history} >= {"signal_awaited", "condition_held", "step_not_taken"}


def test_rejected_return_sends_the_item_back(returns_app, workers):
    app = returns_app
    saga_id = _start(app, workers, "ret-no")
    app.orchestrator.signal(
        saga_id, "inspect", {"decision": "rejected"}, actor="ines", reason="worn"
    )
    state = wait_for_status(app, saga_id, [SagaStatus.COMPLETED])
    assert [n for n, s in state.steps.items() if s.not_taken] == [
        "refund", "restock", "notify_customer"
    ]  # fmt: skip
    assert _one(app, "inventory", "SELECT status FROM inventory.returned_item") == "SENT_BACK"
    assert _one(app, "returns", "SELECT status FROM returns.return_request") == "REJECTED"
    assert _one(app, "payments", "SELECT count(*) FROM payments.refund") == 0


def test_a_declined_refund_cancels_the_return_and_flags_the_item(returns_app, workers):
    app = returns_app
    saga_id = _start(app, workers, "ret-big", amount_cents=150_000)
    app.orchestrator.signal(saga_id, "inspect", {"decision": "accepted"}, actor="i", reason="ok")
    state = wait_for_status(app, saga_id, [SagaStatus.COMPENSATED])
    assert state.steps["refund"].status is StepStatus.FAILED
    assert state.steps["refund"].error == "declined"
    assert state.steps["receive_item"].status is StepStatus.COMPENSATED
    assert _one(app, "inventory", "SELECT status FROM inventory.returned_item") == "FLAGGED"
    assert _one(app, "returns", "SELECT status FROM returns.return_request") == "CANCELLED"


def test_an_inspection_nobody_makes_escalates_then_cancels_the_return(returns_app, workers):
    app = returns_app
    workers.beat()  # the sweeper
    saga_id = _start(app, workers, "ret-late")
    state = wait_for_status(app, saga_id, [SagaStatus.COMPENSATED], timeout=60)
    assert state.steps["inspect"].status is StepStatus.FAILED
    assert state.steps["inspect"].error == "no_signal"
    events = [h["event"] for h in rows(app.engine, "SELECT event FROM saga.saga_history "
                                       "WHERE saga_id = :s ORDER BY id", s=saga_id)]  # fmt: skip
    assert events.index("signal_escalated") < events.index("compensation_started")
    assert _one(app, "inventory", "SELECT status FROM inventory.returned_item") == "FLAGGED"
    late = saga_cli("signal", saga_id, "inspect", "--data", '{"decision": "accepted"}',
                    "--actor", "ines", "--reason", "too late", env=workers.env())  # fmt: skip
    assert late.returncode == 2 and "does not wait for a signal" in late.stderr


@pytest.mark.demo_faults
def test_after_a_crash_past_the_pivot_the_return_completes_forward(returns_app, workers):
    """The orchestrator dies right after committing the refund's success (the restock
    command written, not sent); the notification is refused once. Nothing is undone:
    the restock goes out from the outbox, the notification is sent again as a new
    command, and the return completes."""
    app = returns_app
    workers.beat()  # outbox recovery and the sweeper
    faults = {"saga_tasks.reply@refund": "crash_after_commit", "returns.notify": "refuse"}
    orchestrator = workers.orchestrator()
    workers.participants()
    handle = app.start_saga("return", "ret-crash", {**RETURN, "return_id": "ret-crash",
                                                    "demo_faults": faults})  # fmt: skip
    wait_for(
        lambda: (
            app.orchestrator.get(handle.saga_id).steps["inspect"].status is StepStatus.REQUESTED
        ),
        timeout=30,
        describe="the return to wait for its inspection",
    )
    app.orchestrator.signal(
        handle.saga_id, "inspect", {"decision": "accepted"}, actor="ines", reason="fine"
    )
    wait_for(lambda: not orchestrator.alive(), timeout=30, describe="the orchestrator to die")
    workers.orchestrator()
    state = wait_for_status(app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
    assert state.steps["notify_customer"].generation == 2, "sent again as a new command"
    events = [h["event"] for h in rows(app.engine, "SELECT event FROM saga.saga_history "
                                       "WHERE saga_id = :s ORDER BY id", s=handle.saga_id)]  # fmt: skip
    assert "compensation_started" not in events
    assert events.count("step_failed") == 1
    assert _one(app, "inventory", "SELECT status FROM inventory.returned_item") == "RESTOCKED"
    assert _one(app, "returns", "SELECT count(*) FROM returns.notification") == 1
