"""Sagas on a schedule against real PostgreSQL and RabbitMQ: a firing starts its own
tick's saga once, or records why it started none; ``saga-tasks schedules`` and the
dashboard show each schedule's next run and last run."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from saga_tasks import SagaApp, saga, schedule, step
from saga_tasks.core.schedules import format_tick
from saga_tasks.messaging.admin import queue_depths
from saga_tasks.messaging.topology import declare_topology
from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, rows, scalar
from tests.scheduled_app import TICK_SAGA, build

AUTH = {"Authorization": f"Bearer {ANA_TOKEN}"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def app(settings, clock):
    found = build(settings, clock=clock)
    declare_topology(settings.broker_url, found.topology)
    yield found
    found.close()


def runs(app, name):
    return rows(
        app.engine,
        "SELECT * FROM saga.schedule_run WHERE schedule = :n ORDER BY tick",
        n=name,
    )


def firings(name, outcome):
    labels = {"schedule": name, "outcome": outcome}
    return REGISTRY.get_sample_value("saga_schedule_firings_total", labels) or 0.0


def test_a_tick_fired_twice_starts_one_saga(app, clock):
    s = app.timetable.by_name["every-second"]
    tick = s.tick_at(clock.now())
    before = firings(s.name, "existing")
    first = app.timetable.fire(s.name, format_tick(tick))
    again = app.timetable.fire(s.name, format_tick(tick))
    assert first.outcome == "started" and again.outcome == "existing"
    assert again.saga_id == first.saga_id
    assert firings(s.name, "existing") == before + 1
    saga = rows(app.engine, "SELECT * FROM saga.saga_instance WHERE saga_type = 'tick'")
    assert len(saga) == 1
    assert saga[0]["business_key"] == s.business_key(tick)
    assert saga[0]["payload"] == {"tick": format_tick(tick)}
    # start_saga reports the existing saga for the key: created False, same id.
    handle = app.start_saga("tick", s.business_key(tick), {"tick": format_tick(tick)})
    assert (handle.created, handle.saga_id) == (False, first.saga_id)
    (run,) = runs(app, s.name)
    assert run["tick"] == tick and str(run["saga_id"]) == first.saga_id
    assert run["firings"] == 2 and run["error"] is None and run["started_at"] == clock.now()
    # The start joined the firing's transaction; its first command left after the commit.
    assert app.flush(), "confirmed by the broker"
    assert scalar(app.engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 0
    assert queue_depths(app.settings.broker_url, ["ticks.commands"]) == {"ticks.commands": 1}


def test_a_late_firing_starts_its_own_tick_or_none_never_the_next(app, clock):
    graced = app.timetable.by_name["every-second"]  # grace 30 s
    old = graced.tick_at(clock.now()) - timedelta(seconds=10)
    fired = app.timetable.fire(graced.name, format_tick(old))
    assert fired.outcome == "started"
    key = scalar(app.engine, "SELECT business_key FROM saga.saga_instance")
    assert key == graced.business_key(old), "labelled with its own tick, not now's"

    plain = app.timetable.by_name["every-second-default"]  # grace: until the next tick
    now_tick = plain.tick_at(clock.now())
    previous = now_tick - timedelta(seconds=1)
    late = app.timetable.fire(plain.name, format_tick(previous), missed=3)
    assert late.outcome == "late" and late.saga_id is None
    keys = {plain.business_key(previous), plain.business_key(now_tick)}
    assert not scalar(
        app.engine,
        "SELECT count(*) FROM saga.saga_instance WHERE business_key = ANY(:k)",
        k=list(keys),
    )
    (run,) = runs(app, plain.name)
    # One tick back from the current one: between 1 and 2 s late (2.0 once rounded).
    assert run["saga_id"] is None and re.match(r"late: fired (1\.\d|2\.0) s after", run["error"])
    assert run["missed_before"] == 3
    # The tick is then fired in time (say by another firing): the error is cleared, and a
    # late copy after that never overwrites the saga it started.
    clock_tick = app.timetable.fire(plain.name, format_tick(now_tick))
    assert clock_tick.outcome == "started"
    clock.advance(5)
    assert app.timetable.fire(plain.name, format_tick(now_tick)).outcome == "late"
    run = runs(app, plain.name)[-1]
    assert str(run["saga_id"]) == clock_tick.saga_id and run["error"] is None
    assert run["firings"] == 2


def _raising(tick):
    raise ValueError("customer c-secret-42 has no region")


def _validated(payload):
    if "region" not in payload:
        raise ValueError("region: field required")
    return payload


STRICT = saga(
    "strict", step("build", "reports.build", queue="reports.commands"), payload=_validated
)


def test_a_payload_that_fails_is_logged_counted_and_recorded_never_raised(settings, clock, caplog):
    app = SagaApp(
        sagas=[TICK_SAGA, STRICT],
        schedules=[
            schedule("boom", "tick", every=1, payload=_raising),
            schedule("refused", "strict", every=1, payload=lambda tick: {"zone": "eu"}),
            schedule("not-json", "tick", every=1, payload=lambda tick: {"at": tick}),
        ],
        settings=settings,
        clock=clock,
    )
    try:
        before = firings("boom", "failed")
        with caplog.at_level(logging.INFO, logger="saga_tasks"):
            for name in ("boom", "refused", "not-json"):
                tick = app.timetable.by_name[name].tick_at(clock.now())
                assert app.timetable.fire(name, format_tick(tick)).outcome == "failed"
        assert firings("boom", "failed") == before + 1
        errors = {
            r["schedule"]: r["error"] for r in rows(app.engine, "SELECT * FROM saga.schedule_run")
        }
        assert errors == {
            "boom": "the payload function raised ValueError",
            "refused": "InvalidPayload: strict: region: field required",
            "not-json": "the payload function returned what is not JSON",
        }
        assert not scalar(app.engine, "SELECT count(*) FROM saga.saga_instance")
        assert "c-secret-42" not in caplog.text, "an exception's message may quote data"
        named = {getattr(r, "schedule", None) for r in caplog.records if r.levelname == "ERROR"}
        assert named == {"boom", "refused", "not-json"} and "ValueError" in caplog.text
    finally:
        app.close()


def test_a_firing_that_names_no_tick_of_the_schedule_is_dropped(app, clock):
    s = app.timetable.by_name["nightly"]
    tick = s.tick_at(clock.now())
    for name, when in [
        ("gone", format_tick(tick)),  # a schedule removed since the firing was sent
        ("nightly", format_tick(tick + timedelta(minutes=1))),  # not one of its ticks
        ("nightly", "yesterday"),
    ]:
        assert app.timetable.fire(name, when).outcome == "dropped"
    assert not scalar(app.engine, "SELECT count(*) FROM saga.schedule_run")
    assert app.timetable.fire("nightly", format_tick(tick)).outcome == "started"


def test_old_runs_are_pruned_but_each_schedules_newest_stays(app, clock):
    s = app.timetable.by_name["every-second"]
    first = s.tick_at(clock.now())
    app.timetable.fire(s.name, format_tick(first))
    app.timetable.fire("nightly", format_tick(app.timetable.by_name["nightly"].tick_at(first)))
    clock.advance(2)
    app.timetable.fire(s.name, format_tick(s.tick_at(clock.now())))
    clock.advance(8 * 86_400)
    assert app.timetable.forget_runs() == 1
    assert [
        r["schedule"] for r in rows(app.engine, "SELECT schedule FROM saga.schedule_run ORDER BY 1")
    ] == [
        "every-second",
        "nightly",
    ]


def cli(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "saga_tasks.ops.cli", *args],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_saga_tasks_schedules_lists_next_and_last_runs(app, clock, isolation):
    every = app.timetable.by_name["every-second"]
    started = app.timetable.fire(every.name, format_tick(every.tick_at(clock.now())))
    plain = app.timetable.by_name["every-second-default"]
    late_tick = plain.tick_at(clock.now()) - timedelta(seconds=1)
    assert app.timetable.fire(plain.name, format_tick(late_tick)).outcome == "late"
    env = isolation.env(SAGA_TASKS_APP="tests.scheduled_app:saga_app")

    listed = cli("schedules", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    view = json.loads(listed.stdout)
    assert view["count"] == 3 and set(view) == {"schedules", "count", "now"}
    by_name = {s["name"]: s for s in view["schedules"]}
    assert list(by_name) == ["every-second", "every-second-default", "nightly"]
    first = by_name["every-second"]
    assert set(first) == {
        "name", "saga_type", "schedule", "every_seconds", "cron", "key", "grace_seconds",
        "next_run", "last_run", "last_error",
    }  # fmt: skip
    assert first["saga_type"] == "tick" and first["every_seconds"] == 1.0
    assert first["cron"] is None and first["grace_seconds"] == 30.0
    run = first["last_run"]
    assert set(run) == {
        "tick", "business_key", "saga_id", "saga_status", "started_at", "fired_at",
        "firings", "missed_before", "error",
    }  # fmt: skip
    assert run["saga_id"] == started.saga_id and run["saga_status"] == "RUNNING"
    assert run["business_key"] == every.business_key(every.tick_at(clock.now()))
    assert first["last_error"] is None
    failed = by_name["every-second-default"]
    assert failed["last_run"]["saga_id"] is None
    assert failed["last_run"]["error"].startswith("late:")
    assert failed["last_error"] == failed["last_run"]
    nightly = by_name["nightly"]
    assert nightly["cron"] == "0 2 * * *" and nightly["schedule"] == "cron 0 2 * * *"
    assert nightly["last_run"] is None and nightly["next_run"].endswith("T02:00:00+00:00")

    text = cli("schedules", env=env)
    assert text.returncode == 0, text.stderr
    assert f"saga {started.saga_id} (RUNNING)" in text.stdout
    assert "every-second-default  tick  every 1 s" in text.stdout
    assert "no saga: late:" in text.stdout

    none = cli("schedules", env=isolation.env(SAGA_TASKS_APP="participants.app:saga_app"))
    assert none.returncode == 0 and "no schedules" in none.stdout


def test_the_dashboard_and_the_api_show_the_schedules(app, clock):
    every = app.timetable.by_name["every-second"]
    started = app.timetable.fire(every.name, format_tick(every.tick_at(clock.now())))
    with TestClient(create_web_app(app)) as client:
        shell = client.get("/ui/schedules")
        page = client.get("/ui/schedules", headers=AUTH)
        assert client.get("/schedules").status_code == 401
        api = client.get("/schedules", headers=AUTH).json()
    assert api["schedules"][0]["last_run"]["saga_id"] == started.saga_id, "the API: the same view"
    assert shell.status_code == 401 and started.saga_id not in shell.text
    assert page.status_code == 200
    row = page.text.split('data-schedule="every-second"')[1].split("</tr>")[0]
    assert f"/ui/sagas/{started.saga_id}" in row and "RUNNING" in row and "every 1 s" in row
    nightly = page.text.split('data-schedule="nightly"')[1].split("</tr>")[0]
    assert "cron 0 2 * * *" in nightly and " 02:00:00" in nightly
    assert 'href="/ui/schedules"' in page.text, "in the navigation"


def test_a_tick_whose_saga_was_purged_starts_no_other(app, clock):
    from datetime import timedelta

    from sqlalchemy import text

    s = app.timetable.by_name["every-second"]
    tick = s.tick_at(clock.now())
    first = app.timetable.fire(s.name, format_tick(tick))
    with app.engine.begin() as conn:  # it ended a while ago (its queue has no consumer)
        conn.execute(
            text(
                "UPDATE saga.saga_step SET status = 'SUCCEEDED' WHERE saga_id = :id;"
                "UPDATE saga.outbox SET published_at = :at WHERE saga_id = :id;"
                "UPDATE saga.saga_instance SET status = 'COMPLETED', finished_at = :at "
                "WHERE saga_id = :id"
            ),
            {"id": first.saga_id, "at": clock.now() - timedelta(seconds=5)},
        )
    assert app.maintenance.purge_finished(before=clock.now()) == 1
    again = app.timetable.fire(s.name, format_tick(tick))
    assert (again.outcome, again.saga_id) == ("existing", first.saga_id)
    assert rows(app.engine, "SELECT * FROM saga.saga_instance WHERE saga_type = 'tick'") == []
