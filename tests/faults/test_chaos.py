"""The chaos run, short: faults injected, processes SIGKILLed, invariants checked from the DB."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sqlalchemy import text

from participants.chaos import check_invariants
from tests.conftest import ADMIN_URL, PREFIX
from tests.integration.helpers import ORDER, pump


def test_a_short_chaos_run_breaks_no_invariant(tmp_path, template_database):
    from sqlalchemy.engine import make_url

    env = {
        **os.environ,
        "SAGA_DATABASE_URL": make_url(ADMIN_URL).set(database="unused").render_as_string(False),
    }
    result = subprocess.run(
        [
            sys.executable, "-m", "saga_tasks.ops.cli", "chaos",
            "--sagas", "60", "--seconds", "120", "--kill-every", "2.5", "--json",
            "--log-dir", str(tmp_path / "logs"), "--prefix", PREFIX,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["violations"] == []
    assert sum(report["found"]["statuses"].values()) == 60
    assert set(report["found"]["statuses"]) <= {
        "COMPLETED",
        "COMPENSATED",
        "MANUAL_REVIEW",
        "FAILED",
    }
    assert sum(report["injected"]["kills"].values()) >= 3
    assert report["injected"]["restarts"] >= sum(report["injected"]["kills"].values())


def test_the_checker_sees_each_broken_invariant(order_app, settings):
    """The checker is not a rubber stamp: break each invariant by hand and it says so."""
    order_app.start_saga("order", "ok", ORDER)
    pump(order_app, settings.broker_url)
    assert check_invariants(order_app.engine)[0] == []
    with order_app.engine.begin() as conn:
        conn.execute(text("UPDATE saga.saga_instance SET status = 'COMPENSATED'"))
        conn.execute(text("UPDATE inventory.stock SET reserved = reserved + 1 WHERE sku = 'sku-2'"))
        conn.execute(
            text("UPDATE payments.customer SET authorized_cents = 7 WHERE customer_id = 'c-2'")
        )
        conn.execute(text("UPDATE saga.outbox SET published_at = NULL"))
        conn.execute(text("DELETE FROM saga.saga_history WHERE event = 'saga_started'"))
    violations = " | ".join(check_invariants(order_app.engine)[0])
    assert "still holds stock" in violations
    assert "payment is still authorized" in violations
    assert "order is confirmed" in violations
    assert "stock of sku-2: 1 reserved, reservations hold 0" in violations
    assert "customer c-2: 7 cents authorized, open authorizations hold 0" in violations
    assert "never published from saga.outbox" in violations
    assert "does not start with saga_started" in violations
    assert "has no saga_compensated" in violations
    with order_app.engine.begin() as conn:
        conn.execute(text("UPDATE saga.saga_instance SET status = 'RUNNING'"))
    assert "is still RUNNING" in " | ".join(check_invariants(order_app.engine)[0])
