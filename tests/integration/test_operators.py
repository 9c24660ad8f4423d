"""Operator actions and held messages over real PostgreSQL and RabbitMQ.

Dead letters here are made the way the broker makes them: a command is taken off its
work queue and rejected without requeue, so it really passes through the DLX.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused, InputError, VersionMismatch
from saga_tasks.ops.operator import act
from saga_tasks.ops.views import held_list, held_show, stuck
from saga_tasks.runtime.holding import DEAD_LETTER, PARKING
from saga_tasks.testing import queue_depths
from tests.helpers import (
    ORDER,
    build_order_app,
    drain,
    events,
    pump,
    reject_one,
    rows,
    run_command,
    run_reply,
    scalar,
    to_reserve,
)


def test_a_dead_letter_is_recorded_against_its_saga_and_compensates_it(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_reserve(app, url, "d-1")
    reject_one(url, "inventory.commands")
    assert queue_depths(url, ["saga.dead_letter"])["saga.dead_letter"] == 1
    report = app.intake.take(DEAD_LETTER)
    assert (report.taken, report.recorded, report.fed_to_sagas) == (1, 1, 1)
    (held,) = held_list(app, DEAD_LETTER)["messages"]
    assert held["saga_id"] == handle.saga_id
    assert (held["step"], held["kind"], held["task_name"]) == (
        "reserve_stock",
        "command",
        "inventory.reserve",
    )
    assert held["original_queue"] == "inventory.commands"
    assert held["original_routing_key"] == "command.inventory.reserve.v1"
    assert (
        held["death_count"] == 1
        and held["first_death_at"]
        and held["reason"] == "rejected by the broker"
    )
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATING
    assert state.steps["reserve_stock"].given_up
    pump(app, url)
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPENSATED
    assert ("dead_lettered", "system") in events(app, handle.saga_id)
    # The intake is idempotent: nothing is left, nothing is recorded twice.
    assert app.intake.take(DEAD_LETTER).taken == 0
    from saga_tasks.ops.views import saga_view

    assert [m["id"] for m in saga_view(app, handle.saga_id)["held_messages"]] == [held["id"]]


def test_replay_is_refused_when_unsafe_forced_with_a_reason_and_has_one_effect(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_reserve(app, url, "d-2")
    reject_one(url, "inventory.commands")
    app.intake.take(DEAD_LETTER)
    pump(app, url)  # compensated: release ran first and left a tombstone for the reserve
    (held,) = held_list(app, DEAD_LETTER)["messages"]
    checks = {c["check"]: c for c in held_show(app, held["id"])["replay_checks"]}
    assert checks["saga"]["blocks"] and "COMPENSATED" in checks["saga"]["finding"]
    assert checks["late"]["blocks"] and checks["effect"]["blocks"]
    assert "tombstone" in checks["effect"]["finding"]
    with pytest.raises(ActionRefused, match=r"replay refused: .*the saga is COMPENSATED"):
        app.replayer.replay(held["id"], actor="ana", reason="looks stuck")
    with pytest.raises(InputError, match="force-reason"):
        app.replayer.replay(held["id"], actor="ana", reason="again", force=True)
    result = app.replayer.replay(held["id"], actor="ana", reason="prove it is harmless", force=True,
                    force_reason="the tombstone refuses it")  # fmt: skip
    assert result.forced
    pump(app, url)
    with pytest.raises(ActionRefused, match="already replayed by ana"):
        app.replayer.replay(held["id"], actor="bo", reason="once more")
    app.replayer.replay(
        held["id"], actor="bo", reason="twice", force=True, force_reason="one effect"
    )
    pump(app, url)
    engine = app.engine
    assert scalar(engine, "SELECT count(*) FROM inventory.reservation") == 0
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 0
    assert (
        scalar(engine, "SELECT count(*) FROM inventory.command_ledger WHERE kind = 'tombstone'")
        == 1
    )
    history = events(app, handle.saga_id)
    assert ("replay_refused", "ana") in history
    assert history.count(("operator_replay", "ana")) == 1 and ("operator_replay", "bo") in history
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPENSATED


def test_a_safe_replay_resumes_a_saga_waiting_for_a_person(settings):
    app = build_order_app(settings, on_dead_letter="manual_review")
    url = settings.broker_url
    try:
        handle = to_reserve(app, url, "d-3")
        reject_one(url, "inventory.commands")
        app.intake.take(DEAD_LETTER)
        state = app.orchestrator.get(handle.saga_id)
        assert state.status is SagaStatus.MANUAL_REVIEW
        assert state.steps["reserve_stock"].status is StepStatus.REQUESTED
        (held,) = held_list(app, DEAD_LETTER)["messages"]
        assert not [c for c in held_show(app, held["id"])["replay_checks"] if c["blocks"]]
        with pytest.raises(VersionMismatch):
            app.replayer.replay(
                held["id"], actor="ana", reason="fixed", expect_version=state.version - 1
            )
        app.replayer.replay(
            held["id"], actor="ana", reason="inventory fixed", expect_version=state.version
        )
        pump(app, url)
        assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED
        assert scalar(app.engine, "SELECT count(*) FROM inventory.reservation") == 1
    finally:
        app.close()


def test_retry_step_resends_the_same_command(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_reserve(app, url, "o-1")
    lost = drain(url, "inventory.commands")[0]
    version = app.orchestrator.get(handle.saga_id).version
    view = act(app, handle.saga_id, "retry_step", actor="ana", reason="the command was lost",
               expect_version=version, step="reserve_stock")  # fmt: skip
    assert view["version"] == version + 1
    (again,) = drain(url, "inventory.commands")
    assert again["headers"]["saga_command_id"] == lost["headers"]["saga_command_id"]
    assert again["headers"]["saga_attempt"] == 2
    run_command(app, again)
    pump(app, url)
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED
    assert ("operator_retry_step", "ana") in events(app, handle.saga_id)


def test_a_stale_version_or_a_missing_reason_changes_nothing(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_reserve(app, url, "o-2")
    version = app.orchestrator.get(handle.saga_id).version
    with pytest.raises(VersionMismatch, match=f"is at version {version}, not {version - 1}"):
        act(app, handle.saga_id, "compensate", actor="ana", reason="r", expect_version=version - 1)
    with pytest.raises(InputError, match="--actor and --reason"):
        act(app, handle.saga_id, "compensate", actor="ana", reason=" ", expect_version=version)
    assert app.orchestrator.get(handle.saga_id).version == version


def test_skip_step_marks_it_done_by_hand_and_goes_on(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_reserve(app, url, "o-3")
    drain(url, "inventory.commands")
    version = app.orchestrator.get(handle.saga_id).version
    act(app, handle.saga_id, "skip_step", actor="ana", reason="reserved by hand in the WMS",
        expect_version=version, step="reserve_stock")  # fmt: skip
    state = app.orchestrator.get(handle.saga_id)
    assert state.steps["reserve_stock"].status is StepStatus.SUCCEEDED
    assert state.steps["reserve_stock"].result == {"skipped_by": "ana"}
    assert drain(url, "payments.commands")[0]["headers"]["saga_step"] == "authorize_payment"


def test_compensate_and_resolve(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_reserve(app, url, "o-4")
    run_command(app, drain(url, "inventory.commands")[0])
    run_reply(app, drain(url, "saga.replies")[0])
    v = app.orchestrator.get(handle.saga_id).version
    with pytest.raises(ActionRefused, match="only a saga in MANUAL_REVIEW can be resolved"):
        act(
            app,
            handle.saga_id,
            "resolve",
            actor="ana",
            reason="r",
            expect_version=v,
            resolution="FAILED",
        )
    act(
        app,
        handle.saga_id,
        "compensate",
        actor="ana",
        reason="customer called to cancel",
        expect_version=v,
    )
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATING
    assert state.reason == "operator ana: customer called to cancel"
    with pytest.raises(ActionRefused, match="already compensating"):
        act(
            app, handle.saga_id, "compensate", actor="ana", reason="r", expect_version=state.version
        )
    pump(app, url)  # authorize answers while compensating: it is undone too
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPENSATED
    assert scalar(app.engine, "SELECT status FROM payments.authorization") == "VOIDED"

    other = to_reserve(app, url, "o-5")
    run_command(app, drain(url, "inventory.commands")[0])
    reply = drain(url, "saga.replies")[0]
    run_reply(app, reply)
    conflicting = {**reply, "headers": {**reply["headers"], "id": "conflict-1"},
                   "kwargs": {"outcome": "failure", "error": {"code": "x", "message": ""}}}  # fmt: skip
    run_reply(app, conflicting)
    state = app.orchestrator.get(other.saga_id)
    assert state.status is SagaStatus.MANUAL_REVIEW
    with pytest.raises(ActionRefused, match="resolve to COMPLETED, COMPENSATED or FAILED"):
        act(
            app,
            other.saga_id,
            "resolve",
            actor="bo",
            reason="r",
            expect_version=state.version,
            resolution="RUNNING",
        )
    act(app, other.saga_id, "resolve", actor="bo", reason="checked with the warehouse",
        expect_version=state.version, resolution="failed")  # fmt: skip
    state = app.orchestrator.get(other.saga_id)
    assert state.status is SagaStatus.FAILED and state.finished_at is not None
    assert ("operator_resolve", "bo") in events(app, other.saga_id)


def test_stuck_lists_active_sagas_that_did_not_move(order_app, settings):
    app = order_app
    handle = to_reserve(app, settings.broker_url, "s-1")
    assert stuck(app, older_than=3600)["count"] == 0
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE saga.saga_instance SET updated_at = updated_at - interval '2 hours'")
        )
    found = stuck(app, older_than=3600)
    assert [s["saga_id"] for s in found["stuck"]] == [handle.saga_id]
    assert found["stuck"][0]["idle_seconds"] >= 7200


def test_parked_messages_are_held_and_discarded_with_a_reason(order_app, settings):
    app = order_app
    app.holding.park_raw(body=b"\x00garbage", headers={"task": "orders.create", "id": "p-1"},
             content_type="application/json", content_encoding="utf-8",
             reason="undecodable body: test", from_queue="orders.commands")  # fmt: skip
    assert app.intake.take(PARKING).recorded == 1
    (parked,) = held_list(app, PARKING)["messages"]
    assert (
        parked["reason"] == "undecodable body: test"
        and parked["original_queue"] == "orders.commands"
    )
    shown = held_show(app, parked["id"])
    assert any(c["check"] == "parked" and c["blocks"] for c in shown["replay_checks"])
    app.replayer.discard(parked["id"], actor="ana", reason="test garbage")
    assert held_list(app, PARKING)["count"] == 0
    assert held_list(app, PARKING, status="discarded")["messages"][0]["resolved_by"] == "ana"
    with pytest.raises(ActionRefused, match="already discarded"):
        app.replayer.discard(parked["id"], actor="ana", reason="again")


@pytest.mark.demo_faults
def test_a_refused_compensation_retried_by_an_operator_runs_again(order_app, settings):
    """The retry is a new generation: the ledger runs it (the old id holds a refusal it
    would only repeat), the old id is fenced, and the stock comes back once."""
    app, url = order_app, settings.broker_url
    declined = {
        **ORDER,
        "customer_id": "c-low",
        "amount_cents": 5_000,
        "demo_faults": {"inventory.release": "refuse"},
    }
    handle = app.start_saga("order", "refused-undo", declined)
    pump(app, url)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.MANUAL_REVIEW
    refused = state.steps["reserve_stock"]
    assert refused.status is StepStatus.COMPENSATION_FAILED
    assert scalar(app.engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 2
    act(
        app,
        handle.saga_id,
        "retry_step",
        step="reserve_stock",
        actor="ana",
        reason="stock desk fixed",
        expect_version=state.version,
    )
    pump(app, url)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATED, state.reason
    assert state.steps["reserve_stock"].compensation_id != refused.compensation_id
    assert scalar(app.engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 0
    ledger = rows(
        app.engine,
        "SELECT command_id::text, kind, outcome FROM inventory.command_ledger "
        "WHERE saga_id = :s ORDER BY created_at",
        s=handle.saga_id,
    )
    outcomes = {r["command_id"]: r["outcome"] for r in ledger}
    assert outcomes[refused.compensation_id] == "failure"
    assert outcomes[state.steps["reserve_stock"].compensation_id] == "success"
