"""``saga-tasks bulk``: a retry of 500 sagas in review by incident, killed with SIGKILL
halfway and run again, acts once on each; a dry run counts what it would act on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from sqlalchemy import text

from saga_tasks.core.states import SagaStatus
from saga_tasks.persistence.schema import create_participant_tables, create_redelivery_table
from saga_tasks.testing import pump, ready, wait_for
from tests.helpers import saga_cli, scalar
from tests.integration.bulk_app import build, desk

SAGAS = 500
INCIDENT = "inc-2026-12-04-locked-holds"


def _retry(env: dict[str, str], *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "saga_tasks.ops.cli", "bulk", "retry-step", "--step", "hold",
        "--status", "MANUAL_REVIEW", "--type", "stuck", "--incident", INCIDENT,
        "--actor", "ana", "--reason", "the lock was lifted", *extra,
    ]  # fmt: skip


def test_a_bulk_retry_killed_halfway_and_run_again_acts_once_on_each_saga(settings, isolation):
    app = ready(build(settings))
    try:
        with app.engine.begin() as conn:
            create_participant_tables(conn, desk.schema)
            create_redelivery_table(conn, desk.schema)
        ids = [app.start_saga("stuck", f"k-{i:04d}", {"n": i}).saga_id for i in range(SAGAS)]
        other = app.start_saga("stuck", "z-done", {"n": -1}).saga_id
        pump(app)
        in_review = scalar(
            app.engine, "SELECT count(*) FROM saga.saga_instance WHERE status = 'MANUAL_REVIEW'"
        )
        assert in_review == SAGAS + 1
        env = {**isolation.env(), "SAGA_TASKS_APP": "tests.integration.bulk_app:saga_app"}

        dry = saga_cli("bulk", "retry-step", "--status", "manual_review", "--type", "stuck",
                       "--key-prefix", "k-", "--dry-run", "--json", env=env)  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        shown = json.loads(dry.stdout)
        assert shown["count"] == SAGAS and len(shown["sample"]) == 10
        assert shown["sample"][0]["business_key"] == "k-0000"

        # Slowed down, killed once it has acted on some and not all.
        runner = subprocess.Popen(
            _retry(env, "--key-prefix", "k-", "--rate", "80"),
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: scalar(app.engine, "SELECT count(*) FROM saga.bulk_item") >= 120,
                timeout=60,
                describe="the bulk run to act on 120 sagas",
            )
        finally:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=30)
        halfway = scalar(app.engine, "SELECT count(*) FROM saga.bulk_item")
        assert 120 <= halfway < SAGAS

        again = saga_cli(*_retry(env, "--key-prefix", "k-", "--json")[3:], env=env)
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)
        assert (report["accepted"], report["refused"]) == (SAGAS, 0)
        assert report["this_run"] == SAGAS - halfway
        assert report["selected"] == SAGAS

        with app.engine.connect() as conn:
            per_saga = dict(
                conn.execute(
                    text(
                        "SELECT saga_id::text, count(*) FROM saga.saga_history "
                        "WHERE event = 'operator_retry_step' AND reason LIKE :incident "
                        "GROUP BY saga_id"
                    ),
                    {"incident": f"%[incident {INCIDENT}]%"},
                ).all()
            )
            generations = dict(
                conn.execute(
                    text("SELECT saga_id::text, generation FROM saga.saga_step WHERE step = 'hold'")
                ).all()
            )
        assert per_saga == dict.fromkeys(ids, 1), "one retry per saga, none twice, none missed"
        assert {generations[i] for i in ids} == {2} and generations[other] == 1
        assert {app.orchestrator.get(i).status for i in ids} == {SagaStatus.COMPENSATING}
        assert app.orchestrator.get(other).status is SagaStatus.MANUAL_REVIEW

        nothing = saga_cli("bulk", "retry-step", "--status", "MANUAL_REVIEW", "--key-prefix",
                           "k-", "--dry-run", "--json", env=env)  # fmt: skip
        assert json.loads(nothing.stdout)["count"] == 0

        # The incident's name holds its action: another under it is refused.
        mixed = saga_cli("bulk", "cancel", "--incident", INCIDENT, "--actor", "ana",
                         "--reason", "x", env=env)  # fmt: skip
        assert mixed.returncode == 2
        assert f"incident {INCIDENT!r} was a bulk retry-step" in mixed.stderr

        # A verb the decider refuses is counted, with its reason, and the run goes on.
        refused = saga_cli("bulk", "skip-step", "--step", "charge", "--key-prefix", "z-",
                           "--incident", "inc-skip", "--actor", "ana", "--reason", "try",
                           "--json", env=env)  # fmt: skip
        assert refused.returncode == 0, refused.stderr
        said = json.loads(refused.stdout)
        assert (said["accepted"], said["refused"]) == (0, 1)
        assert said["refusals"][0]["saga_id"] == other
    finally:
        app.close()


def _in_review(app, keys):
    ids = [
        app.start_saga(app.registry.latest("stuck").saga_type, k, {"k": k}).saga_id for k in keys
    ]
    pump(app)
    assert {app.orchestrator.get(i).status for i in ids} == {SagaStatus.MANUAL_REVIEW}
    return ids


def test_an_incident_is_about_the_sagas_there_were_when_it_began(settings):
    from saga_tasks.ops import bulk
    from saga_tasks.persistence.bulk import Selection

    app = ready(build(settings))
    try:
        with app.engine.begin() as conn:
            create_participant_tables(conn, desk.schema)
            create_redelivery_table(conn, desk.schema)
        first = _in_review(app, ["a-1", "a-2", "a-3"])
        review = Selection(status="MANUAL_REVIEW")
        kw = {"actor": "ana", "reason": "closed by hand", "resolution": "FAILED"}
        done = bulk.run(app, "inc-cap", "resolve", review, **kw)
        assert (done.accepted, done.total) == (3, 3)
        later = _in_review(app, ["a-4"])
        again = bulk.run(app, "inc-cap", "resolve", review, **kw)
        assert (again.this_run, again.accepted) == (0, 3)
        assert app.orchestrator.get(later[0]).status is SagaStatus.MANUAL_REVIEW
        assert {app.orchestrator.get(i).status for i in first} == {SagaStatus.FAILED}
    finally:
        app.close()


def test_a_saga_this_process_cannot_decide_is_refused_and_the_run_goes_on(settings):
    from saga_tasks import saga, step
    from saga_tasks.ops import bulk
    from saga_tasks.persistence.bulk import Selection
    from tests.integration.bulk_app import STUCK, charge, hold, unhold

    newer = saga(
        "stuck",
        step("hold", hold, compensation=unhold, timeout=60),
        step("charge", charge, timeout=60, depends_on=["hold"]),
        version=2,
    )
    both = ready(
        type(build(settings))(sagas=[STUCK, newer], participants=[desk], settings=settings)
    )
    app = build(settings)
    try:
        with app.engine.begin() as conn:
            create_participant_tables(conn, desk.schema)
            create_redelivery_table(conn, desk.schema)
        (v2,) = _in_review(both, ["v2-old"])  # started first, under version 2
        with app.engine.begin() as conn:
            conn.execute(text("UPDATE saga.saga_instance SET created_at = created_at - "
                              "interval '1 hour' WHERE saga_id = :id"), {"id": v2})  # fmt: skip
        v1 = _in_review(app, ["v1-a", "v1-b"])
        review = Selection(status="MANUAL_REVIEW")
        kw = {"actor": "ana", "reason": "closed by hand", "resolution": "FAILED"}
        done = bulk.run(app, "inc-versions", "resolve", review, **kw)
        assert (done.accepted, done.refused) == (2, 1)
        assert done.refusals[0][0] == v2 and "version 2" in done.refusals[0][1]
        assert {app.orchestrator.get(i).status for i in v1} == {SagaStatus.FAILED}
        assert both.orchestrator.get(v2).status is SagaStatus.MANUAL_REVIEW
    finally:
        app.close()
        both.close()


def test_a_mistyped_option_is_refused_before_the_incident_is_begun(settings):
    import pytest

    from saga_tasks.errors import InputError
    from saga_tasks.ops import bulk
    from saga_tasks.persistence.bulk import Selection

    app = ready(build(settings))
    try:
        review = Selection(status="MANUAL_REVIEW")
        with pytest.raises(InputError, match="needs --to, one of COMPLETED, COMPENSATED, FAILED"):
            bulk.run(
                app, "inc-typo", "resolve", review, actor="a", reason="r", resolution="COMPLETD"
            )
        with pytest.raises(InputError, match="no saga definition loaded here has a step 'hodl'"):
            bulk.run(app, "inc-typo", "retry-step", review, actor="a", reason="r", step="hodl")
        assert scalar(app.engine, "SELECT count(*) FROM saga.bulk_run") == 0
    finally:
        app.close()
