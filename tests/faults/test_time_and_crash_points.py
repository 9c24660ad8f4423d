"""Deadlines, late replies and crash points with real workers, beat and SIGKILL."""

from __future__ import annotations

import signal

import pytest

from saga_tasks.core.states import SagaStatus
from saga_tasks.testing import wait_for, wait_for_status
from tests.helpers import ORDER, assert_each_effect_once, participant_db, reserved, rows, scalar


def history(app, saga_id):
    return rows(
        app.engine,
        "SELECT event, step, reason, message_id FROM saga.saga_history WHERE saga_id = :s ORDER BY id",
        s=saga_id,
    )


@pytest.mark.demo_faults
def test_payment_timeout_late_success_is_compensated(fast_app, workers):
    workers.orchestrator()
    workers.beat()
    workers.participants()
    # authorize: 1.8 s a try, then longer ones (backoff), and its re-sends wait behind the
    # busy payments queue; the saga's deadline (18 s) gives the step up at the latest. The
    # payment service takes 22 s.
    payload = {**ORDER, "demo_faults": {"payments.authorize": "slow:22"}}
    handle = fast_app.start_saga("order", "late-1", payload)
    state = wait_for_status(fast_app, handle.saga_id, [SagaStatus.COMPENSATED], timeout=60)
    assert state.steps["authorize_payment"].given_up
    wait_for(
        lambda: (
            scalar(
                participant_db(fast_app, "payments"), "SELECT status FROM payments.authorization"
            )
            == "VOIDED"
        ),
        timeout=30,
        describe="the late authorization to be voided",
    )
    assert (
        scalar(participant_db(fast_app, "payments"), "SELECT count(*) FROM payments.authorization")
        == 1
    )
    assert (
        scalar(participant_db(fast_app, "inventory"), "SELECT status FROM inventory.reservation")
        == "RELEASED"
    )
    assert reserved(fast_app, "sku-1") == 0
    assert (
        scalar(participant_db(fast_app, "orders"), "SELECT status FROM orders.orders")
        == "CANCELLED"
    )
    events = wait_for(
        lambda: (
            (h := [e["event"] for e in history(fast_app, handle.saga_id)])
            and "late_reply" in h
            and h
        ),
        timeout=30,
        describe="the late success to be recorded",
    )
    assert events.count("step_resent") == 2
    assert "step_given_up" in events
    # The re-sent commands were answered from the ledger with the stored reply: duplicates.
    wait_for(
        lambda: "duplicate_message" in [e["event"] for e in history(fast_app, handle.saga_id)],
        timeout=30,
        describe="the duplicate late reply to be recorded",
    )
    assert fast_app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPENSATED


@pytest.mark.demo_faults
def test_orchestrator_killed_during_compensation(fast_app, workers):
    orchestrator = workers.orchestrator()
    workers.beat()
    workers.participants()
    payload = {**ORDER, "customer_id": "c-low", "demo_faults": {"inventory.release": "slow:1"}}
    handles = [fast_app.start_saga("order", f"kc-{i}", payload) for i in range(4)]
    wait_for(
        lambda: (
            scalar(
                fast_app.engine,
                "SELECT count(*) FROM saga.saga_instance WHERE status = 'COMPENSATING'",
            )
            >= 2
        ),
        timeout=30,
        describe="sagas compensating",
    )
    orchestrator.kill(signal.SIGKILL)
    workers.orchestrator()
    for handle in handles:
        state = wait_for_status(fast_app, handle.saga_id, [SagaStatus.COMPENSATED], timeout=60)
        assert [s.status.value for s in state.steps.values()] == [
            "COMPENSATED",
            "COMPENSATED",
            "FAILED",
            "SKIPPED",
        ]
    assert (
        scalar(
            participant_db(fast_app, "inventory"),
            "SELECT count(*) FROM inventory.reservation WHERE status = 'RELEASED'",
        )
        == 4
    )
    assert reserved(fast_app, "sku-1") == 0
    assert (
        scalar(
            participant_db(fast_app, "orders"),
            "SELECT count(*) FROM orders.orders WHERE status = 'CANCELLED'",
        )
        == 4
    )
    assert (
        scalar(
            participant_db(fast_app, "inventory"),
            "SELECT count(*) FROM inventory.command_ledger WHERE kind = 'compensation'",
        )
        == 4
    )


@pytest.mark.demo_faults
def test_orchestrator_killed_after_commit_before_publish(order_app, workers):
    first = workers.orchestrator()
    workers.beat()
    workers.participants()
    payload = {**ORDER, "demo_faults": {"saga_tasks.reply@reserve_stock": "crash_after_commit"}}
    handle = order_app.start_saga("order", "cp-1", payload)
    wait_for(lambda: not first.alive(), timeout=30, describe="the orchestrator to kill itself")
    # Committed: reserve_stock succeeded and authorize_payment is requested; not published.
    state = order_app.orchestrator.get(handle.saga_id)
    assert state.steps["authorize_payment"].status.value == "REQUESTED"
    # The authorize command never went out; only recovery can send it. (Commands before
    # it may be out but not marked yet: marks are gathered for SAGA_MARK_INTERVAL, and
    # if recovery sends one of those again, a participant's ledger makes it a duplicate.)
    never_sent = scalar(
        order_app.engine,
        "SELECT message_id::text FROM saga.outbox WHERE task_name = 'payments.authorize' "
        "AND published_at IS NULL",
    )
    assert never_sent is not None
    workers.orchestrator()
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
    assert scalar(
        order_app.engine,
        "SELECT recovered AND published_at IS NOT NULL FROM saga.outbox WHERE message_id = :m",
        m=never_sent,
    )
    assert_each_effect_once(order_app, 1)


@pytest.mark.demo_faults
def test_orchestrator_killed_after_publish_before_ack(order_app, workers):
    first = workers.orchestrator()
    workers.participants()
    payload = {**ORDER, "demo_faults": {"saga_tasks.reply@reserve_stock": "crash_after_publish"}}
    handle = order_app.start_saga("order", "cp-2", payload)
    wait_for(lambda: not first.alive(), timeout=30, describe="the orchestrator to kill itself")
    workers.orchestrator()
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
    events = [e["event"] for e in history(order_app, handle.saga_id)]
    # The unacked reply came again and met the inbox.
    assert events.count("duplicate_message") == 1
    assert_each_effect_once(order_app, 1)


@pytest.mark.demo_faults
def test_relay_killed_after_publish_before_marking(order_app, workers):
    workers.start("maintenance", ["saga.maintenance"])
    replies = workers.start("replies", ["saga.replies"])
    workers.beat()
    workers.participants()
    # The authorize command is left to recovery (the orchestrator dies after committing
    # it); recovery dies after publishing it, before marking it, once.
    payload = {
        **ORDER,
        "demo_faults": {
            "saga_tasks.reply@reserve_stock": "crash_after_commit",
            "saga_tasks.relay": "crash_after_publish",
        },
    }
    handle = order_app.start_saga("order", "cp-3", payload)
    wait_for(lambda: not replies.alive(), timeout=30, describe="the orchestrator to die")
    workers.start("replies", ["saga.replies"])
    maintenance = workers.started[0]
    wait_for(lambda: not maintenance.alive(), timeout=30, describe="outbox recovery to die")
    workers.start("maintenance", ["saga.maintenance"])
    wait_for_status(order_app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
    events = [e["event"] for e in history(order_app, handle.saga_id)]
    assert events.count("demo_fault") == 1
    assert events.count("step_succeeded") == 4
    # Published twice (before the crash, and again by the next pass): the payments ledger
    # answers the second from its record, and the orchestrator takes that reply as a
    # duplicate; one transition.
    wait_for(
        lambda: "duplicate_message" in [e["event"] for e in history(order_app, handle.saga_id)],
        timeout=30,
        describe="the second publish of the recovered command to be deduplicated",
    )
    # The second pass marks the row once its publish is confirmed.
    wait_for(
        lambda: (
            scalar(
                order_app.engine,
                "SELECT count(*) FROM saga.outbox "
                "WHERE recovered AND task_name = 'payments.authorize'",
            )
            == 1
        ),
        timeout=30,
        describe="the recovered command to be marked published",
    )
    assert_each_effect_once(order_app, 1)


def test_a_standby_beat_takes_over_when_the_active_one_is_killed(order_app, workers):
    workers.start("maintenance", ["saga.maintenance"])
    first = workers.beat("beat-a")
    wait_for(
        lambda: "Acquired lock" in first.log_text(), timeout=30, describe="the first beat to lead"
    )
    second = workers.beat("beat-b")
    wait_for(
        lambda: "Sending due task" in first.log_text(), timeout=30, describe="the leader to send"
    )
    assert "Acquired lock" not in second.log_text(), "two beats hold the lease"
    assert "Sending due task" not in second.log_text()
    first.kill(signal.SIGKILL)
    wait_for(
        lambda: "Acquired lock" in second.log_text(),
        timeout=30,
        describe="the standby to take the lease",
    )
    wait_for(
        lambda: "Sending due task saga-timeout-sweep" in second.log_text(),
        timeout=30,
        describe="the standby to sweep",
    )
