"""``saga-tasks migrate`` and ``POST /sagas/{id}/migrate`` over real PostgreSQL and RabbitMQ:
a version 1 order saga moved to version 2 (``tests/versioned_app.py``) goes on under it;
one that has begun a step version 2 changes is refused, and nothing is written."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from participants.seed import seed
from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.messaging.topology import declare_topology
from saga_tasks.ops.cli import EXIT_CONFIG, EXIT_INPUT
from saga_tasks.persistence.versions import unfinished_versions
from saga_tasks.runtime.versions import unloaded
from saga_tasks.testing import queue_depths, wait_for
from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, ORDER, RETRY_TIERS, drain, pump, rows, run_command, run_reply
from tests.helpers import saga_cli as cli
from tests.versioned_app import build

HISTORY = (
    "SELECT event, actor, reason, detail FROM saga.saga_history WHERE saga_id = :s ORDER BY id"
)


@pytest.fixture
def apps(settings):
    """(version 1 only, versions 1 and 2) on this test's services."""
    v1_only, both = build("1", settings), build("1,2", settings)
    declare_topology(settings.broker_url, both.topology)
    seed(both.participant_engine)
    yield v1_only, both
    v1_only.close()
    both.close()


@pytest.fixture
def env(isolation):
    return isolation.env(
        SAGA_TASKS_APP="tests.versioned_app:saga_app",
        SAGA_TEST_VERSIONS="1,2",
        SAGA_RETRY_TIERS=RETRY_TIERS,
    )


def v1_saga(apps, url, key, *, replies):
    """A version 1 saga, moved by ``replies`` answers: 1 leaves reserve_stock awaited,
    2 authorize_payment."""
    v1_only, both = apps
    saga_id = v1_only.start_saga("order", key, ORDER).saga_id
    for queue in ["orders.commands", "inventory.commands"][:replies]:
        run_command(both, drain(url, queue)[0])
        run_reply(both, drain(url, "saga.replies")[0])
    return saga_id


def test_migrate_moves_a_saga_on_to_version_2(apps, env, settings):
    url, both = settings.broker_url, apps[1]
    saga_id = v1_saga(apps, url, "m-1", replies=1)
    before = both.orchestrator.get(saga_id)
    assert before.steps["reserve_stock"].status is StepStatus.REQUESTED
    assert unloaded(both.engine, build("2", settings).registry)[0].sagas == 1

    done = cli("migrate", saga_id, "--to-version", "2", "--actor", "ana", "--reason",
               "v2 authorizes alongside", "--expect-version", str(before.version), "--json",
               env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["definition_version"] == 2 and view["version"] == before.version + 1
    # Version 2 asks for the payment once the order exists: sent at once, not stalled.
    assert [s["status"] for s in view["steps"]] == ["SUCCEEDED", "REQUESTED", "REQUESTED",
                                                     "PENDING"]  # fmt: skip
    history = rows(both.engine, HISTORY, s=saga_id)
    moved = next(h for h in history if h["event"] == "definition_migrated")
    assert moved["actor"] == "ana" and moved["reason"] == "operator ana: v2 authorizes alongside"
    assert moved["detail"] == {"actor": "ana", "from_version": 1, "to_version": 2,
                               "added_steps": [], "dropped_steps": []}  # fmt: skip
    assert history[-1]["event"] == "step_requested" and history[-1]["actor"] == "ana"
    wait_for(lambda: queue_depths(url, ["payments.commands"])["payments.commands"] == 1)

    pump(both, url)
    after = both.orchestrator.get(saga_id)
    assert (after.status, after.definition_version) == (SagaStatus.COMPLETED, 2)
    with both.engine.connect() as conn:
        assert unfinished_versions(conn) == []


def test_migrate_refuses_a_saga_past_what_version_2_changes_and_writes_nothing(apps, env, settings):
    url, both = settings.broker_url, apps[1]
    saga_id = v1_saga(apps, url, "m-2", replies=2)
    before = both.orchestrator.get(saga_id)
    assert before.steps["authorize_payment"].status is StepStatus.REQUESTED
    written = len(rows(both.engine, HISTORY, s=saga_id))

    refused = cli("migrate", saga_id, "--to-version", "2", "--actor", "ana", "--reason", "try",
                  env=env)  # fmt: skip
    assert refused.returncode == EXIT_INPUT, refused.stderr
    assert refused.stderr.strip() == (
        "error: cannot migrate to version 2: step 'authorize_payment' is REQUESTED and differs "
        "there (depends_on [reserve_stock] -> [create_order])"
    )
    unknown = cli("migrate", saga_id, "--to-version", "3", "--actor", "ana", "--reason", "try",
                  env=env)  # fmt: skip
    assert unknown.returncode == EXIT_CONFIG
    assert "saga type 'order' version 3 is not loaded in this process (loaded: 1, 2)" in (
        unknown.stderr
    )
    stale = cli("migrate", saga_id, "--to-version", "2", "--actor", "ana", "--reason", "try",
                "--expect-version", str(before.version - 1), env=env)  # fmt: skip
    assert stale.returncode == EXIT_INPUT and "look at it again" in stale.stderr
    same = cli("migrate", saga_id, "--to-version", "1", "--actor", "ana", "--reason", "try",
               env=env)  # fmt: skip
    assert same.returncode == EXIT_INPUT and "already runs version 1" in same.stderr

    after = both.orchestrator.get(saga_id)
    assert (after.version, after.definition_version) == (before.version, 1)
    assert len(rows(both.engine, HISTORY, s=saga_id)) == written


def test_the_http_api_migrates_with_the_operate_scope(apps, settings):
    url, both = settings.broker_url, apps[1]
    saga_id = v1_saga(apps, url, "m-3", replies=1)
    with TestClient(create_web_app(both), headers={"Authorization": f"Bearer {ANA_TOKEN}"}) as c:
        r = c.post(f"/sagas/{saga_id}/migrate", json={"reason": "v2", "to_version": 3})
        assert r.status_code == 409 and r.json()["type"].endswith("version-not-loaded"), r.text
        r = c.post(f"/sagas/{saga_id}/migrate", json={"reason": "v2", "to_version": 2})
        assert r.status_code == 200, r.text
        assert r.json()["definition_version"] == 2
        r = c.post(f"/sagas/{saga_id}/migrate", json={"reason": "back", "to_version": 2})
        assert r.status_code == 409 and "already runs version 2" in r.json()["detail"]


def test_the_step_rows_follow_the_version_moved_to(apps, settings):
    """Steps the saga never reached are dropped or added, and stored in the new order."""
    from dataclasses import replace

    from participants import inventory, orders, payments
    from saga_tasks import SagaApp, step
    from tests.versioned_app import order_versions

    v1 = order_versions()[1]
    audit = step("audit", "orders.audit", queue="orders.commands", depends_on=["create_order"])
    v3 = replace(v1, steps=(audit, *v1.steps[:2]), version=3)
    app = SagaApp(
        sagas=[v1, v3],
        participants=[orders.participant, inventory.participant, payments.participant],
        settings=settings,
    )
    try:
        saga_id = apps[0].start_saga("order", "m-4", ORDER).saga_id  # create_order awaited
        after = app.orchestrator.migrate(
            saga_id, 3, actor="ana", reason="fewer steps", expect_version=None
        )
        assert list(after.steps) == ["create_order", "audit", "reserve_stock"]
        stored = rows(
            app.engine,
            "SELECT step, position, status FROM saga.saga_step WHERE saga_id = :s ORDER BY position",
            s=saga_id,
        )
        assert [(r["step"], r["position"], r["status"]) for r in stored] == [
            ("create_order", 0, "REQUESTED"),
            ("audit", 1, "PENDING"),
            ("reserve_stock", 2, "PENDING"),
        ]
        loaded = app.orchestrator.get(saga_id)
        assert (loaded.steps, loaded.definition_version) == (after.steps, 3)
        (moved,) = [h for h in rows(app.engine, HISTORY, s=saga_id) if h["actor"] == "ana"]
        assert moved["detail"]["added_steps"] == ["audit"]
        assert moved["detail"]["dropped_steps"] == ["authorize_payment", "confirm_order"]
    finally:
        app.close()


def test_a_step_the_new_version_adds_is_sent_at_once_under_flow_control(apps, settings):
    """``migrate`` staged its decision for flow control against the saga before the move
    (``FlowControl.stage``, ``old.steps[step]``), where a step the new version adds is
    not: a new step whose parents have succeeded raised ``KeyError`` (flow control is on by
    default), the migration rolled back and the API answered 500."""
    from dataclasses import replace

    from participants import inventory, orders, payments
    from saga_tasks import SagaApp, step
    from tests.versioned_app import order_versions

    v1 = order_versions()[1]
    audit = step("audit", "orders.audit", queue="orders.commands", depends_on=["create_order"])
    v3 = replace(v1, steps=(*v1.steps, audit), version=3)
    app = SagaApp(
        sagas=[v1, v3],
        participants=[orders.participant, inventory.participant, payments.participant],
        settings=settings,
    )
    url = settings.broker_url
    try:
        assert app.flow.limits["orders.commands"].max_in_flight == 32, "the default limit"
        saga_id = v1_saga(apps, url, "m-5", replies=1)  # create_order succeeded
        with TestClient(create_web_app(app), headers={"Authorization": f"Bearer {ANA_TOKEN}"}) as c:
            r = c.post(f"/sagas/{saga_id}/migrate", json={"reason": "audit", "to_version": 3})
        assert r.status_code == 200, r.text
        assert r.json()["definition_version"] == 3
        after = app.orchestrator.get(saga_id)
        assert after.steps["audit"].status is StepStatus.REQUESTED
        (sent,) = drain(url, "orders.commands")
        assert (sent["headers"]["task"], sent["headers"]["saga_step"]) == ("orders.audit", "audit")
        # Sent under flow control: it holds a place at its queue until it answers.
        placed = rows(
            app.engine,
            "SELECT step, sent_at IS NOT NULL AS sent FROM saga.saga_dispatch WHERE saga_id = :s",
            s=saga_id,
        )
        assert {(r["step"], r["sent"]) for r in placed} >= {("audit", True)}
    finally:
        app.close()
