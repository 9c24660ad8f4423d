"""The orchestrator and participant shells over real queues, driven in this process.

``pump`` takes each message off its real queue and hands it to the same code a
worker task runs, so ordering and duplication are under the test's control.
"""

from __future__ import annotations

import threading

from saga_tasks.core.states import Classification, SagaStatus
from tests.helpers import ORDER, drain, pump, rows, run_command, run_reply, scalar


def test_the_order_saga_completes(order_app, settings):
    handle = order_app.start_saga("order", "p-1", ORDER)
    pump(order_app, settings.broker_url)
    state = order_app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPLETED
    engine = order_app.engine
    assert scalar(engine, "SELECT status FROM orders.orders") == "CONFIRMED"
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 2
    assert scalar(engine, "SELECT status FROM payments.authorization") == "AUTHORIZED"


def test_stock_failure_cancels_the_order(order_app, settings):
    handle = order_app.start_saga(
        "order", "p-2", {**ORDER, "items": [{"sku": "sku-empty", "qty": 1}]}
    )
    pump(order_app, settings.broker_url)
    state = order_app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATED
    assert "out_of_stock" in state.steps["reserve_stock"].error
    assert scalar(order_app.engine, "SELECT status FROM orders.orders") == "CANCELLED"
    assert scalar(order_app.engine, "SELECT count(*) FROM payments.authorization") == 0


def test_declined_payment_releases_stock_and_cancels_the_order(order_app, settings):
    handle = order_app.start_saga("order", "p-3", {**ORDER, "customer_id": "c-low"})
    pump(order_app, settings.broker_url)
    state = order_app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATED
    assert state.steps["authorize_payment"].error == "declined"
    engine = order_app.engine
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 0
    assert scalar(engine, "SELECT status FROM inventory.reservation") == "RELEASED"
    assert scalar(engine, "SELECT status FROM orders.orders") == "CANCELLED"


def test_a_reply_delivered_twice_makes_one_transition(order_app, settings):
    handle = order_app.start_saga("order", "p-4", ORDER)
    (command,) = drain(settings.broker_url, "orders.commands")
    run_command(order_app, command)
    (reply,) = drain(settings.broker_url, "saga.replies")
    assert run_reply(order_app, reply) is Classification.ACCEPTED
    version = order_app.orchestrator.get(handle.saga_id).version
    assert run_reply(order_app, reply) is Classification.DUPLICATE
    assert order_app.orchestrator.get(handle.saga_id).version == version
    history = rows(order_app.engine, "SELECT event, message_id FROM saga.saga_history ORDER BY id")
    assert [h["event"] for h in history].count("step_succeeded") == 1
    assert {"event": "duplicate_message", "message_id": reply["headers"]["id"]} in history
    assert len(drain(settings.broker_url, "inventory.commands")) == 1


def test_a_reply_delivered_twice_at_once_makes_one_transition(order_app, settings):
    handle = order_app.start_saga("order", "p-5", ORDER)
    (command,) = drain(settings.broker_url, "orders.commands")
    run_command(order_app, command)
    (reply,) = drain(settings.broker_url, "saga.replies")
    outcomes = []
    barrier = threading.Barrier(4)

    def deliver() -> None:
        barrier.wait()
        outcomes.append(run_reply(order_app, reply))

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.value for o in outcomes) == ["accepted", "duplicate", "duplicate", "duplicate"]
    assert order_app.orchestrator.get(handle.saga_id).version == 2
    assert len(drain(settings.broker_url, "inventory.commands")) == 1


def test_a_command_delivered_twice_has_one_effect(order_app, settings):
    order_app.start_saga("order", "p-6", ORDER)
    (create,) = drain(settings.broker_url, "orders.commands")
    run_command(order_app, create)
    run_reply(order_app, drain(settings.broker_url, "saga.replies")[0])
    (reserve,) = drain(settings.broker_url, "inventory.commands")
    assert run_command(order_app, reserve) == "success"
    assert run_command(order_app, reserve, redelivered=True) == "duplicate"
    engine = order_app.engine
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 2
    assert scalar(engine, "SELECT count(*) FROM inventory.reservation") == 1
    first, second = drain(settings.broker_url, "saga.replies")
    # The duplicate re-sends the stored reply under the same message id.
    assert first["headers"]["id"] == second["headers"]["id"]
    assert first["kwargs"] == second["kwargs"]


def test_compensation_before_its_command_leaves_a_tombstone(order_app, settings):
    """The "reserve after release" bug: the late reserve must never take effect."""
    order_app.start_saga("order", "p-7", ORDER)
    run_command(order_app, drain(settings.broker_url, "orders.commands")[0])
    run_reply(order_app, drain(settings.broker_url, "saga.replies")[0])
    (reserve,) = drain(settings.broker_url, "inventory.commands")
    headers = reserve["headers"]
    release = {
        "headers": {
            **headers,
            "id": "11111111-1111-1111-1111-111111111111",
            "task": "inventory.release",
            "saga_message_kind": "compensation",
            "saga_command_id": "22222222-2222-2222-2222-222222222222",
            "saga_compensates": headers["saga_command_id"],
        },
        "kwargs": reserve["kwargs"],
    }
    assert run_command(order_app, release) == "success"
    assert run_command(order_app, reserve) == "duplicate"
    engine = order_app.engine
    assert scalar(engine, "SELECT count(*) FROM inventory.reservation") == 0
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 0
    ledger = rows(engine, "SELECT kind, outcome FROM inventory.command_ledger ORDER BY created_at")
    assert {"kind": "tombstone", "outcome": "failure"} in ledger
    replies = drain(settings.broker_url, "saga.replies")
    refusal = next(
        r for r in replies if r["headers"]["saga_command_id"] == headers["saga_command_id"]
    )
    assert refusal["kwargs"]["outcome"] == "failure"
    assert refusal["kwargs"]["error"]["code"] == "compensated_before_execution"


def test_replies_that_make_no_sense_are_recorded(order_app, settings):
    handle = order_app.start_saga("order", "p-8", ORDER)
    app = order_app.orchestrator
    unknown = "00000000-0000-4000-8000-000000000000"
    good = {
        "saga_id": handle.saga_id,
        "saga_step": "create_order",
        "saga_message_kind": "reply",
        "saga_reply_to_kind": "command",
        "saga_command_id": unknown,
    }
    assert app.handle_reply("a", {}, {"outcome": "success"}) is Classification.INVALID
    assert (
        app.handle_reply("b", {**good, "saga_id": unknown}, {"outcome": "success"})
        is Classification.INVALID
    )
    assert app.handle_reply("c", good, {"outcome": "success"}) is Classification.INVALID
    assert (
        app.handle_reply("d", {**good, "saga_step": "nope"}, {"outcome": "success"})
        is Classification.INVALID
    )
    reasons = [
        r["reason"]
        for r in rows(order_app.engine, "SELECT reason FROM saga.invalid_message ORDER BY id")
    ]
    assert reasons[0] == "missing or empty header 'saga_id'"
    assert reasons[1] == f"reply for unknown saga {unknown}"
    assert "did not send" in reasons[2]
    assert "unknown step 'nope'" in reasons[3]
    assert order_app.orchestrator.get(handle.saga_id).version == 1
    events = [r["event"] for r in rows(order_app.engine, "SELECT event FROM saga.saga_history")]
    assert events.count("invalid_message") == 2


def _blocked_on_a_lock(engine) -> bool:
    return bool(
        scalar(
            engine,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'",
        )
    )


def test_a_reply_that_waits_for_the_saga_lock_reads_the_steps_as_committed(order_app, settings):
    """Under READ COMMITTED a locking read that waits re-reads only the locked row: the
    steps must come from after the wait, or the reply decides on steps someone (a sweep)
    has just changed and writes the old values back."""
    from dataclasses import replace

    from saga_tasks.persistence import sagas

    handle = order_app.start_saga("order", "lk-1", ORDER)
    engine, order = order_app.engine, [s.name for s in order_app.registry.latest("order").steps]
    now = order_app.clock.now()
    seen = {}
    with engine.connect() as holder:
        with holder.begin():
            state = sagas.lock(holder, handle.saga_id)
            moved = replace(
                state,
                version=state.version + 1,
                steps={  # the first and the last step row: every joined row must be fresh
                    **state.steps,
                    "create_order": replace(state.steps["create_order"], attempt=2),
                    "confirm_order": replace(state.steps["confirm_order"], attempt=5),
                },
            )
            changes = sagas.Changes()
            changes.save(state, moved, order)
            sagas.write_changes(holder, changes, now)

            def reply() -> None:
                with engine.begin() as conn:
                    seen["claimed"] = sagas.claim_and_lock(
                        conn, "orchestrator", "m-lk", handle.saga_id
                    )
                    seen["locked"] = sagas.lock(conn, handle.saga_id)

            waiter = threading.Thread(target=reply)
            waiter.start()
            from saga_tasks.testing import wait_for

            wait_for(lambda: _blocked_on_a_lock(engine), describe="the reply to wait for the lock")
        waiter.join(timeout=30)
    new, after = seen["claimed"]
    assert new and after.version == moved.version
    assert after.steps["create_order"].attempt == 2, "steps read before the wait"
    assert after.steps["confirm_order"].attempt == 5, "steps read before the wait"
    assert seen["locked"].steps["confirm_order"].attempt == 5
