"""Retention: finished sagas are purged in batches with everything that names them, each
leaving a tombstone; active sagas, sagas in review and sagas still owing a message are
never touched; a purged id answers "purged" (CLI, API), and its business key may start a
new saga."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from saga_tasks import CommandContext, Participant, SagaApp, SagaStatus, saga, step
from saga_tasks.errors import BusinessRejection, SagaPurged
from saga_tasks.persistence import purge
from saga_tasks.persistence.schema import create_participant_tables, create_redelivery_table
from saga_tasks.testing import pump, ready
from tests.helpers import ANA_TOKEN, saga_cli, scalar

till = Participant("purgetill")


@till.command("take")
def take(ctx: CommandContext) -> dict[str, Any]:
    return {"taken": True}


@till.compensation("give_back", undoes="take")
def give_back(ctx: CommandContext) -> None:
    if ctx.payload.get("stick"):
        raise BusinessRejection("locked", "cannot give back")


@till.command("confirm")
def confirm(ctx: CommandContext) -> None:
    if ctx.payload.get("refuse"):
        raise BusinessRejection("declined", "no")


SALE = saga(
    "sale",
    step("take", take, compensation=give_back, timeout=60),
    step("confirm", confirm, timeout=60, depends_on=["take"]),
)
TABLES = (
    "saga_step",
    "saga_history",
    "outbox",
    "inbox",
    "saga_note_tally",
    "saga_dispatch",
    "held_message",
    "alert_sent",
    "bulk_item",
)


def test_finished_sagas_are_purged_and_nothing_else(settings, isolation):
    app = ready(SagaApp(sagas=[SALE], participants=[till], settings=settings))
    try:
        with app.engine.begin() as conn:
            create_participant_tables(conn, till.schema)
            create_redelivery_table(conn, till.schema)
        from fastapi.testclient import TestClient

        from saga_tasks.web import create_web_app

        client = TestClient(create_web_app(app))
        bearer = {"Authorization": f"Bearer {ANA_TOKEN}"}
        posted = client.post(
            "/sagas/sale",
            json={"business_key": "web-1", "payload": {}},
            headers={**bearer, "Idempotency-Key": "key-1"},
        )
        assert posted.status_code == 202, posted.text
        done = [app.start_saga("sale", f"ok-{i}", {}).saga_id for i in range(4)]
        done.append(posted.json()["saga_id"])
        unknown = app.start_saga("sale", "unknown-outcome", {}).saga_id
        undone = [app.start_saga("sale", f"no-{i}", {"refuse": True}).saga_id for i in range(2)]
        review = app.start_saga("sale", "stuck", {"refuse": True, "stick": True}).saga_id
        pump(app)
        active = app.start_saga("sale", "running", {}).saga_id  # its command not yet taken
        assert app.orchestrator.get(review).status is SagaStatus.MANUAL_REVIEW
        owing = done[0]  # still owes the broker a message: passed over until it owes none
        with app.engine.begin() as conn:
            conn.execute(
                text("UPDATE saga.outbox SET published_at = NULL WHERE message_id = "
                     "(SELECT message_id FROM saga.outbox WHERE saga_id = :id LIMIT 1)"),
                {"id": owing},
            )  # fmt: skip
        with app.engine.begin() as conn:  # a step given up, its outcome never told
            conn.execute(
                text("UPDATE saga.saga_step SET status = 'TIMED_OUT', given_up = true "
                     "WHERE saga_id = :id AND step = 'confirm'"),
                {"id": unknown},
            )  # fmt: skip
        before = app.clock.now() + timedelta(seconds=1)
        with app.engine.connect() as conn:
            assert purge.due(conn, before=before)[0] == 6
            assert purge.due(conn, before=before, saga_type="other") == (0, None)

        purged = app.maintenance.purge_finished(before=before, budget=60)
        assert purged == 6
        gone = [*done[1:], *undone]
        with app.engine.connect() as conn:
            for table in TABLES:
                left = conn.execute(
                    text(
                        f"SELECT count(*) FROM saga.{table} WHERE saga_id = ANY(CAST(:ids AS uuid[]))"
                    ),
                    {"ids": gone},
                ).scalar()
                assert left == 0, table
            kept = conn.execute(text("SELECT count(*) FROM saga.saga_instance")).scalar()
        assert kept == 4  # in review, active, owing, an outcome still unknown
        assert app.orchestrator.get(review).status is SagaStatus.MANUAL_REVIEW
        assert app.orchestrator.get(active).status is SagaStatus.RUNNING
        assert app.orchestrator.get(owing).status is SagaStatus.COMPLETED
        assert scalar(app.engine, "SELECT count(*) FROM saga.purged_saga") == 6

        with pytest.raises(SagaPurged) as told:
            app.orchestrator.get(undone[0])
        assert told.value.status == "COMPENSATED" and "was purged at" in str(told.value)

        shown = saga_cli("show", undone[0], env=isolation.env())
        assert shown.returncode == 2 and "was purged at" in shown.stderr
        assert "it ended COMPENSATED" in shown.stderr

        answer = client.get(f"/sagas/{done[1]}", headers=bearer)
        assert answer.status_code == 410
        assert answer.json()["status_was"] == "COMPLETED"
        # A client retrying its start after the purge is told so, not given a second saga.
        retried = client.post(
            "/sagas/sale",
            json={"business_key": "web-1", "payload": {}},
            headers={**bearer, "Idempotency-Key": "key-1"},
        )
        assert retried.status_code == 410, retried.text
        with pytest.raises(SagaPurged):
            app.orchestrator.signal(done[1], "take", {}, actor="ana", reason="late")
        from saga_tasks.testing.invariants import lost_messages

        said = " ".join(lost_messages(app.engine, [till]))
        assert not [i for i in gone if i in said], "a purged saga's inbox is no loss"

        # Its business key is free again: a new saga, not the purged one.
        again = app.start_saga("sale", "ok-1", {})
        assert again.created and again.saga_id != done[1]

        # Once it owes nothing, the last finished one goes too; run again: nothing left.
        with app.engine.begin() as conn:
            conn.execute(
                text("UPDATE saga.outbox SET published_at = now() WHERE saga_id = :id"),
                {"id": owing},
            )
        assert app.maintenance.purge_finished(before=before, budget=60) == 1
        with app.engine.begin() as conn:  # a late answer told the outcome
            conn.execute(
                text("UPDATE saga.saga_step SET last_error = 'late_success' "
                     "WHERE saga_id = :id AND step = 'confirm'"),
                {"id": unknown},
            )  # fmt: skip
        assert app.maintenance.purge_finished(before=before, budget=60) == 1
        assert app.maintenance.purge_finished(before=before, budget=60) == 0

        env = {**isolation.env(), "SAGA_TASKS_APP": "tests.integration.bulk_app:saga_app"}
        soon = saga_cli("purge", "--finished-before", "2999-01-01", env=env)
        assert soon.returncode == 2 and "is within SAGA_REPLAY_MAX_AGE" in soon.stderr
    finally:
        app.close()


def test_retention_zero_keeps_everything_and_the_setting_refuses_less_than_the_replay_horizon():
    from saga_tasks import Settings
    from saga_tasks.errors import ConfigurationError

    assert Settings.from_env({}, retention_days=0).retention_days == 0
    with pytest.raises(ConfigurationError, match="shorter than SAGA_REPLAY_MAX_AGE"):
        Settings.from_env({}, retention_days=0.5, replay_max_age=86400)
