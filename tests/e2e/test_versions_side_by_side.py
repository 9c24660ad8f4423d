"""Two versions of the order saga side by side, through real worker processes: sagas keep
the version they started with, new ones take the newest, and an orchestrator that lacks a
version unfinished sagas use refuses to start (the app: ``tests/versioned_app.py``)."""

from __future__ import annotations

import subprocess
import sys

from participants.seed import seed
from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.messaging.topology import declare_topology
from saga_tasks.testing import WorkerProcess, wait_for, wait_for_status
from saga_tasks.worker.versions import EXIT_VERSIONS
from tests.helpers import ORDER, rows
from tests.versioned_app import build

ORCHESTRATOR_QUEUES = ["saga.replies", "saga.maintenance"]
HISTORY = "SELECT event, step FROM saga.saga_history WHERE saga_id = :s ORDER BY id"


def start(workers, name, queues, versions, *, wait=True):
    """A worker of the versioned app loading ``versions``; a participant's has no
    orchestrator database (it decides nothing, so it checks nothing)."""
    own = {"SAGA_DATABASE_URL": ""} if all(q.endswith(".commands") for q in queues) else {}
    worker = WorkerProcess(
        "tests.versioned_app",
        queues=queues,
        name=name,
        env={**workers.env(SAGA_TEST_VERSIONS=versions), **own},
        log_dir=workers.log_dir,
    )
    workers.started.append(worker)  # stopped after the test
    return worker.start(wait=wait)


def orchestrator_loading(workers, versions):
    """An orchestrator worker run to its end: (exit code, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.versioned_app", "worker",
         "-Q", ",".join(ORCHESTRATOR_QUEUES), "-n", f"v{versions}@%h", "-P", "solo",
         "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
        env=workers.env(SAGA_TEST_VERSIONS=versions),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def test_sagas_keep_their_version_and_a_worker_without_it_refuses_to_start(settings, workers):
    v1_only, both = build("1", settings), build("1,2", settings)
    declare_topology(settings.broker_url, both.topology)
    seed(both.participant_engine)
    try:
        old = [v1_only.start_saga("order", f"v1-{i}", ORDER).saga_id for i in range(2)]
        # Version 1 only; the inventory participant is not there: both sagas wait for it.
        orchestrator = start(workers, "orchestrator-v1", ORCHESTRATOR_QUEUES, "1", wait=False)
        orders = start(workers, "orders", ["orders.commands"], "2", wait=False)
        orchestrator.wait_ready()
        orders.wait_ready()

        def waiting_for_stock():
            found = [both.orchestrator.get(s).steps["reserve_stock"].status for s in old]
            return all(s is StepStatus.REQUESTED for s in found)

        wait_for(waiting_for_stock, timeout=20, describe="v1 sagas waiting for their stock")
        orchestrator.stop()

        code, stdout, stderr = orchestrator_loading(workers, "2")
        assert code == EXIT_VERSIONS, (stdout, stderr)
        said = "saga type 'order' version 1 is used by 2 unfinished sagas (loaded here: 2)"
        assert f"error: refusing to start: {said}" in stderr
        assert "CRITICAL saga_tasks.worker refusing to start" in stderr  # its log line
        assert "saga-tasks migrate SAGA_ID --to-version V" in stderr
        assert " ready." not in stdout + stderr, "it never consumed a message"

        side_by_side = start(workers, "orchestrator-v1v2", ORCHESTRATOR_QUEUES, "1,2", wait=False)
        rest = start(workers, "rest", ["inventory.commands", "payments.commands"], "2", wait=False)
        new = [both.start_saga("order", f"v2-{i}", ORDER).saga_id for i in range(2)]
        rest.wait_ready()
        for saga_id in old + new:
            wait_for_status(both, saga_id, [SagaStatus.COMPLETED], timeout=20)
        assert [both.orchestrator.get(s).definition_version for s in old + new] == [1, 1, 2, 2]

        def payment_asked_before_stock_held(saga_id):
            said = [
                (r["event"], r["step"])
                for r in rows(both.engine, HISTORY, s=saga_id)
                if r["step"] in ("reserve_stock", "authorize_payment")
            ]
            asked = said.index(("step_requested", "authorize_payment"))
            return asked < said.index(("step_succeeded", "reserve_stock"))

        # Each went the way of its own version.
        assert [payment_asked_before_stock_held(s) for s in old + new] == [0, 0, 1, 1]
        # Nothing uses version 1 any more: an orchestrator without it starts.
        side_by_side.stop()
        start(workers, "orchestrator-v2", ORCHESTRATOR_QUEUES, "2")
    finally:
        v1_only.close()
        both.close()
