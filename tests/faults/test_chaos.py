"""The chaos run, short: faults injected, processes SIGKILLed, RabbitMQ and PostgreSQL
restarted, an operator acting at random, invariants checked from the database; and the
checks themselves, each shown to see what it is for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from saga_tasks.ops.processes import wait_for
from tests.helpers import ADMIN_URL, ORDER, PREFIX, pump, scalar
from tools.chaos.checks import (
    Done,
    check_invariants,
    lost_messages,
    operator_accounting,
)
from tools.chaos.monitor import Monitor
from tools.chaos.services import (
    BROKER,
    DATABASE,
    OutageRunner,
    ServiceControl,
    plan_outages,
)

SAGAS = 80


@pytest.mark.exclusive  # it restarts RabbitMQ and PostgreSQL: no other test may run meanwhile
@pytest.mark.timeout(300)  # a whole chaos run, with restarts of both services
def test_a_short_chaos_run_breaks_no_invariant(tmp_path, template_database):
    """80 sagas over 20 s: a SIGKILL every 2.5 s, RabbitMQ down and up, then PostgreSQL,
    and an operator acting every second. Restarting the services ends every connection
    on the machine, this test's included; they answer again when it returns."""
    from sqlalchemy.engine import make_url

    from saga_tasks.ops.services import check_broker
    from saga_tasks.persistence.db import check_database

    env = {
        **os.environ,
        "SAGA_DATABASE_URL": make_url(ADMIN_URL).set(database="unused").render_as_string(False),
    }
    result = subprocess.run(
        [
            sys.executable, "-m", "saga_tasks.ops.cli", "chaos",
            "--sagas", str(SAGAS), "--interval", "0.25", "--seconds", "150",
            "--kill-every", "2.5", "--broker-restarts", "1", "--db-restarts", "1",
            "--outage", "2", "--restart-gap", "8", "--operator-every", "1", "--json",
            "--log-dir", str(tmp_path / "logs"), "--prefix", PREFIX,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )  # fmt: skip
    check_database(ADMIN_URL)
    check_broker("amqp://guest:guest@127.0.0.1:5672//")
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(result.stdout[-3000:] + result.stderr[-3000:]) from None
    said = json.dumps(
        {k: report[k] for k in ("violations", "evidence", "harness_errors")}, indent=1
    )
    assert report["violations"] == [], said
    assert report["harness_errors"] == [], said
    assert result.returncode == 0, result.stderr[-3000:]
    assert sum(report["found"]["statuses"].values()) == SAGAS
    assert set(report["found"]["statuses"]) <= {
        "COMPLETED",
        "COMPENSATED",
        "MANUAL_REVIEW",
        "FAILED",
    }
    injected = report["injected"]
    assert sum(injected["kills"].values()) >= 3
    assert injected["restarts"] >= sum(injected["kills"].values())
    outages = {o["kind"]: o for o in injected["outages"]}
    assert set(outages) == {BROKER, DATABASE}
    for outage in outages.values():
        assert outage["error"] is None
        assert outage["back_at"] > outage["stopped_at"] >= outage["planned_at"]
    assert injected["operator"]["attempts"] >= 5
    assert injected["operator"]["done"] >= 1
    assert injected["operator"]["errors"] == []
    assert report["found"]["monitor"]["samples"] >= 10
    # Load is no reason for a person, nor for undoing a good order.
    paths = json.dumps(report["paths"], indent=1)
    assert report["manual_review_by_load"] == 0, paths
    assert report["paths"]["good_orders_compensated"] == 0, paths


def test_the_checker_sees_each_broken_invariant(order_app, settings):
    """The checker is not a rubber stamp: break each invariant by hand and it says so."""
    order_app.start_saga("order", "ok", ORDER)
    pump(order_app, settings.broker_url)
    assert check_invariants(order_app.engine, order_app.participant_engine)[0] == []
    with order_app.participant_engine("inventory").begin() as conn:
        conn.execute(text("UPDATE inventory.stock SET reserved = reserved + 1 WHERE sku = 'sku-2'"))
    with order_app.participant_engine("payments").begin() as conn:
        conn.execute(
            text("UPDATE payments.customer SET authorized_cents = 7 WHERE customer_id = 'c-2'")
        )
    with order_app.engine.begin() as conn:
        conn.execute(text("UPDATE saga.saga_instance SET status = 'COMPENSATED'"))
        conn.execute(text("UPDATE saga.outbox SET published_at = NULL"))
        conn.execute(text("DELETE FROM saga.saga_history WHERE event = 'saga_started'"))
    violations = " | ".join(check_invariants(order_app.engine, order_app.participant_engine)[0])
    assert "still holds stock" in violations
    assert "payment is still authorized" in violations
    assert "order is confirmed" in violations
    assert "stock of sku-2: 1 reserved, reservations hold 0" in violations
    assert "customer c-2: 7 cents authorized, open authorizations hold 0" in violations
    assert "never published from saga.outbox" in violations
    assert "does not start with saga_started" in violations
    assert "has no saga_compensated" in violations
    assert "is COMPENSATED but step reserve_stock is SUCCEEDED" in violations
    with order_app.engine.begin() as conn:
        conn.execute(text("UPDATE saga.saga_instance SET status = 'RUNNING'"))
    assert "is still RUNNING" in " | ".join(
        check_invariants(order_app.engine, order_app.participant_engine)[0]
    )


def _history(conn, saga_id, event, step, actor, before="REQUESTED", reason="by hand"):
    conn.execute(
        text(
            "INSERT INTO saga.saga_history (saga_id, at, event, step, status_before, "
            "status_after, step_status_before, step_status_after, actor, reason) "
            "VALUES (:s, now(), :e, :step, 'RUNNING', 'RUNNING', :b, 'SUCCEEDED', :a, :r)"
        ),
        {"s": saga_id, "e": event, "step": step, "a": actor, "b": before, "r": reason},
    )


def test_the_checker_holds_each_step_to_its_effect_and_counts_what_operators_did(
    order_app, settings
):
    """A step's effect must agree with its status; a step done by hand must not be done
    by its participant too; an undone-by-hand step is not looked for; the history must
    name every operator; published messages must reach their consumers."""
    saga_id = order_app.start_saga("order", "ok", ORDER).saga_id
    pump(order_app, settings.broker_url)
    engine = order_app.engine
    assert lost_messages(engine, order_app.participant_engine) == []
    with order_app.participant_engine("payments").begin() as conn:
        # The payment's effect disappears although its step says it succeeded.
        conn.execute(text("UPDATE payments.authorization SET status = 'VOIDED'"))
        conn.execute(text("UPDATE payments.customer SET authorized_cents = 0"))
    with engine.begin() as conn:
        # An operator said the stock was reserved by hand: the participant did it as well.
        _history(conn, saga_id, "step_succeeded", "reserve_stock", "ana")
    violations = " | ".join(check_invariants(engine, order_app.participant_engine)[0])
    assert "step authorize_payment is SUCCEEDED but its effect is missing" in violations
    assert (
        "step reserve_stock was done by hand (ana, skipped while REQUESTED) "
        "and by its participant as well" in violations
    )

    with engine.begin() as conn:
        conn.execute(text("UPDATE saga.saga_instance SET status = 'COMPENSATED'"))
        conn.execute(text("UPDATE saga.saga_step SET status = 'COMPENSATED'"))
        conn.execute(text("DELETE FROM saga.saga_history WHERE actor = 'ana'"))
        conn.execute(
            text(
                "INSERT INTO saga.saga_history (saga_id, at, event, status_before, status_after,"
                " actor, reason) VALUES (:s, now(), 'saga_compensated', 'COMPENSATING', "
                "'COMPENSATED', 'system', NULL)"
            ),
            {"s": saga_id},
        )
    with order_app.participant_engine("orders").begin() as conn:
        conn.execute(text("UPDATE orders.orders SET status = 'CANCELLED'"))
    violations = " | ".join(check_invariants(engine, order_app.participant_engine)[0])
    assert "is COMPENSATED but still holds stock" in violations
    assert "step reserve_stock is COMPENSATED but its effect is there" in violations
    # Undone by hand: the reservation is the operator's to account for, not a leak.
    with engine.begin() as conn:
        _history(conn, saga_id, "step_compensated", "reserve_stock", "ana", "COMPENSATING")
        _history(conn, saga_id, "operator_skip_step", "reserve_stock", "system", reason="")
        _history(conn, saga_id, "conflicting_reply", "reserve_stock", "system", reason="x")
    violations = " | ".join(check_invariants(engine, order_app.participant_engine)[0])
    assert "still holds stock" not in violations
    assert "reserve_stock is COMPENSATED but its effect is there" not in violations
    assert "history entry operator_skip_step by 'system' lacks actor or reason" in violations
    assert "a reply of step reserve_stock was taken as conflicting (x)" in violations

    assert operator_accounting(engine, [Done(saga_id, "compensate", "ana")]) == [
        f"saga {saga_id}: 1 operator_compensate by ana done, 0 in its history"
    ]
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM saga.inbox"))
        conn.execute(text("DELETE FROM saga.outbox WHERE task_name = 'orders.confirm'"))
    with order_app.participant_engine("inventory").begin() as conn:
        conn.execute(text("DELETE FROM inventory.command_ledger"))
    lost = " | ".join(lost_messages(engine, order_app.participant_engine))
    assert "from inventory (" in lost
    assert "was published and never reached the orchestrator" in lost
    assert "(inventory.reserve) was published and never reached inventory" in lost
    violations = " | ".join(check_invariants(engine, order_app.participant_engine)[0])
    assert "step confirm_order's command" in violations
    assert "was requested but has no outbox row" in violations


def test_the_monitor_sees_a_dead_end_and_a_sweep_that_claims_without_progress(order_app, settings):
    ids = [order_app.start_saga("order", f"m-{i}", ORDER).saga_id for i in range(4)]
    dead_end, stuck, moved, replied = ids
    engine = order_app.engine

    def due(conn, saga_id, seconds_ago, **extra):
        sets = ", ".join(["next_wake_at = now() - make_interval(secs => :ago)",
                          *(f"{k} = {v}" for k, v in extra.items())])  # fmt: skip
        conn.execute(
            text(f"UPDATE saga.saga_instance SET {sets} WHERE saga_id = :s"),
            {"s": saga_id, "ago": seconds_ago},
        )

    with engine.begin() as conn:
        due(conn, dead_end, 1, status="'COMPENSATING'")
        conn.execute(
            text("UPDATE saga.saga_step SET status = 'COMPENSATED' WHERE saga_id = :s"),
            {"s": dead_end},
        )
        due(conn, stuck, 30)
        due(conn, moved, 20)
        due(conn, replied, 10)
    monitor = Monitor(settings.database_url, time.monotonic(), overdue_after=600)
    try:
        monitor.sample()
        assert [f.kind for f in monitor.findings.values()] == ["dead end"]
        # A reply moves a saga due after the stuck one: no sweep passed it by.
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE saga.saga_instance SET version = version + 1 WHERE saga_id = :s"),
                {"s": replied},
            )
            conn.execute(
                text(
                    "INSERT INTO saga.saga_history (saga_id, at, event, actor, causation_id) "
                    "VALUES (:s, now(), 'step_succeeded', 'system', 'a-reply')"
                ),
                {"s": replied},
            )
            # A note on a duplicate has no causation, but names its message: no sweep.
            conn.execute(
                text(
                    "INSERT INTO saga.saga_history (saga_id, at, event, actor, message_id) "
                    "VALUES (:s, now(), 'duplicate_message', 'system', 'a-duplicate')"
                ),
                {"s": replied},
            )
        monitor.sample()
        assert monitor.stall_strikes == {}
        # Three sweeps move a saga due after the stuck one and leave the stuck one alone.
        for round_ in range(3):
            with engine.begin() as conn:
                due(conn, moved, 19 - round_, version="version + 1")
                conn.execute(
                    text(
                        "INSERT INTO saga.saga_history (saga_id, at, event, actor) "
                        "VALUES (:s, now(), 'step_resent', 'system')"
                    ),
                    {"s": moved},
                )
            monitor.sample()
        kinds = {(f.kind, f.saga_id) for f in monitor.findings.values()}
        assert kinds == {("dead end", dead_end), ("claimed without progress", stuck)}
        assert monitor.stall_strikes.get(replied) is None
        monitor.overdue_after = 0
        monitor.sample()
        assert ("overdue", stuck) in {(f.kind, f.saga_id) for f in monitor.findings.values()}
        assert stuck in monitor.flagged()
    finally:
        monitor.stop()
    assert scalar(engine, "SELECT count(*) FROM saga.saga_instance") == 4


def test_outages_are_planned_apart_and_a_service_down_at_the_end_comes_back():
    plan = plan_outages(broker_restarts=2, database_restarts=1, load_seconds=40, down_for=2, gap=12)
    assert [o.kind for o in plan] == [BROKER, DATABASE, BROKER]
    assert [o.at for o in plan] == [10.0, 22.0, 34.0]

    class Fake(ServiceControl):
        def __init__(self):
            super().__init__("amqp://x", "postgresql://x")
            self.up = {BROKER: True, DATABASE: True}
            self.calls = []

        def stop(self, kind):
            self.calls.append(f"stop {kind}")
            self.up[kind] = False

        def start(self, kind):
            self.calls.append(f"start {kind}")
            self.up[kind] = True

        def answers(self, kind):
            return self.up[kind]

    fake = Fake()
    runner = OutageRunner(
        fake,
        plan_outages(broker_restarts=1, database_restarts=0, load_seconds=0, down_for=60,
                     gap=1, first_at=0),
        time.monotonic(),
    )  # fmt: skip
    runner.start()
    wait_for(lambda: not fake.up[BROKER], timeout=10, interval=0.01)
    runner.stop()  # mid-outage: the broker is started again before stop returns
    assert fake.calls == [f"stop {BROKER}", f"start {BROKER}"]
    assert fake.up[BROKER] is True
    assert runner.plan[0].back_at is not None
    assert runner.errors() == []

    # A guard that does not allow it: the outage is skipped and said so, nothing stopped.
    fake.calls.clear()
    guarded = OutageRunner(
        fake,
        plan_outages(broker_restarts=0, database_restarts=1, load_seconds=0, down_for=0,
                     gap=1, first_at=0),
        time.monotonic(),
        guard="exit 1",
        guard_timeout=0,
    )  # fmt: skip
    guarded.start()
    wait_for(guarded.done, timeout=10)
    assert fake.calls == []
    assert guarded.errors() == [
        "database outage at 0s: skipped: --outage-guard did not allow it in 0s"
    ]

    monitor = Monitor(
        "postgresql+psycopg2://nobody@127.0.0.1/none",
        0.0,
        outage_grace=5,
        outages=lambda: [(25, 30), (10, 20)],
    )
    # 10-25 and 25-35 (each with its grace) merge: 25 s of the 100 do not count.
    assert monitor._counted(0, 100) == 75
    assert monitor._counted(12, 22) == 0
    monitor.stop()
