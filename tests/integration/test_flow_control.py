"""Flow control and admission control over real PostgreSQL and RabbitMQ: commands beyond a
queue's limit wait in PostgreSQL, go out as answers come, and their deadlines run from
dispatch; starts beyond a configured load are refused, then admitted again."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import SagaOverloaded
from saga_tasks.web import create_web_app
from tests.helpers import (
    ANA_TOKEN,
    ORDER,
    build_order_app,
    drain,
    in_review_with_its_reserve_waiting,
    pump,
    rows,
    run_command,
    run_reply,
    saga_cli,
    scalar,
    to_reserve,
)

AUTH = {"Authorization": f"Bearer {ANA_TOKEN}"}


@pytest.fixture
def limited(settings, clock):
    """The order saga with at most two inventory commands out at once."""
    app = build_order_app(dataclasses.replace(settings, max_in_flight="inventory=2"), clock=clock)
    app.sweeper._backlog = dict  # about flow control alone, not the backlog check
    yield app
    app.close()


def to_reserve_all(app, url, keys):
    """Start a saga per key and answer each create_order: each then sends reserve_stock."""
    handles = [app.start_saga("order", key, ORDER) for key in keys]
    for command in drain(url, "orders.commands"):
        run_command(app, command)
    for reply in drain(url, "saga.replies"):
        run_reply(app, reply)
    return handles


def waiting(app, queue):
    return scalar(
        app.engine,
        "SELECT count(*) FROM saga.saga_dispatch WHERE queue = :q AND sent_at IS NULL "
        "AND withdrawn_at IS NULL",
        q=queue,
    )


def events_of(app, event):
    return scalar(app.engine, "SELECT count(*) FROM saga.saga_history WHERE event = :e", e=event)


def test_a_participant_at_its_limit_gets_no_more_commands_until_it_answers(
    limited, clock, settings
):
    app, url = limited, settings.broker_url
    to_reserve_all(app, url, [f"fc-{i}" for i in range(5)])
    out = drain(url, "inventory.commands")
    assert len(out) == 2, "two in flight, the limit"
    assert waiting(app, "inventory.commands") == 3
    app.sweeper.sweep()  # a sweep releases nothing while both are unanswered
    assert drain(url, "inventory.commands") == []
    # One answer frees one place: exactly one more command goes out.
    run_command(app, out[0])
    (reply,) = drain(url, "saga.replies")
    run_reply(app, reply)
    (released,) = drain(url, "inventory.commands")
    assert released["headers"]["task"] == "inventory.reserve"
    assert waiting(app, "inventory.commands") == 2
    # Past the step's timeout: the waiting commands were never sent, so nothing is sent
    # again and no attempt is spent; the history says why.
    clock.advance(31)
    app.sweeper.sweep()
    assert events_of(app, "dispatch_waiting") == 2
    assert events_of(app, "step_resent") == 2, "only the two sent and unanswered"
    attempts = rows(
        app.engine,
        "SELECT attempt FROM saga.saga_step WHERE step = 'reserve_stock' ORDER BY attempt",
    )
    assert [r["attempt"] for r in attempts] == [1, 1, 1, 2, 2]


def test_a_released_commands_deadline_runs_from_dispatch(limited, clock, settings):
    app, url = limited, settings.broker_url
    to_reserve_all(app, url, ["fd-0", "fd-1", "fd-2"])
    out = drain(url, "inventory.commands")
    clock.advance(25)  # the third saga's command has waited 25 s of its 30 s timeout
    for command in out:
        run_command(app, command)
    dispatched_at = clock.now()
    for reply in drain(url, "saga.replies"):
        run_reply(app, reply)  # room: the third command is sent now
    (late,) = [
        m for m in drain(url, "inventory.commands") if m["headers"]["task"] == "inventory.reserve"
    ]
    clock.advance(10)  # 35 s after the decision, 10 s after dispatch
    app.sweeper.sweep()
    reserve = app.orchestrator.get(late["headers"]["saga_id"]).steps["reserve_stock"]
    assert reserve.attempt == 1, "not sent again: it has had 10 s of its 30"
    assert reserve.deadline == dispatched_at + timedelta(seconds=30)
    assert events_of(app, "deadline_from_dispatch") == 1
    assert events_of(app, "step_resent") == 0


def test_a_rate_limit_sends_one_command_per_interval(settings, clock):
    app = build_order_app(dataclasses.replace(settings, rate_limit="orders=1"), clock=clock)
    try:
        url = settings.broker_url
        for i in range(3):
            app.start_saga("order", f"fr-{i}", ORDER)
        assert len(drain(url, "orders.commands")) == 1, "a bucket of one second's worth"
        app.sweeper.sweep()
        assert drain(url, "orders.commands") == [], "no time has passed: no token"
        clock.advance(1)
        app.sweeper.sweep()
        assert len(drain(url, "orders.commands")) == 1
        clock.advance(5)  # the bucket holds one second's worth, not five
        app.sweeper.sweep()
        assert len(drain(url, "orders.commands")) == 1
        assert waiting(app, "orders.commands") == 0
    finally:
        app.close()


def test_admission_refuses_over_the_limit_and_admits_again_under_it(settings, isolation):
    app = build_order_app(dataclasses.replace(settings, max_active="order=2"))
    app.admission.refresh = 0  # read the counts at every start
    url = settings.broker_url
    try:
        first = app.start_saga("order", "adm-0", ORDER)
        app.start_saga("order", "adm-1", ORDER)
        with pytest.raises(SagaOverloaded, match="2 order sagas are active") as refused:
            app.start_saga("order", "adm-2", ORDER)
        assert refused.value.retry_after >= 1
        assert scalar(app.engine, "SELECT count(*) FROM saga.saga_instance") == 2
        again = app.start_saga("order", "adm-0", ORDER)  # a repeat is answered as always
        assert again.saga_id == first.saga_id and not again.created
        with TestClient(create_web_app(app), headers=AUTH) as client:
            answer = client.post(
                "/sagas/order",
                json={"business_key": "adm-3", "payload": ORDER},
                headers={"Idempotency-Key": "adm-3"},
            )
        assert answer.status_code == 429, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.json()["type"].endswith("overloaded")
        env = isolation.env(SAGA_MAX_ACTIVE="order=2", SAGA_TASKS_APP="participants.app:saga_app")
        cli = saga_cli("start", "order", "--key", "adm-4", "--payload", json.dumps(ORDER), env=env)
        assert cli.returncode == 4, cli.stderr
        assert "refused" in cli.stderr
        pump(app, url)  # both sagas finish
        assert scalar(app.engine, "SELECT count(*) FROM saga.saga_instance") == 2
        assert app.orchestrator.get(first.saga_id).status is SagaStatus.COMPLETED
        assert app.start_saga("order", "adm-2", ORDER).created
    finally:
        app.close()


def test_the_backlog_of_each_participant_is_seen_on_metrics_and_the_dashboard(limited, settings):
    app, url = limited, settings.broker_url
    to_reserve_all(app, url, [f"fs-{i}" for i in range(4)])
    with TestClient(create_web_app(app), headers=AUTH) as client:
        metrics = client.get("/metrics").text
        page = client.get("/").text
    assert 'saga_dispatch_waiting{queue="inventory.commands"} 2.0' in metrics
    assert 'saga_dispatch_in_flight{queue="inventory.commands"} 2.0' in metrics
    assert 'saga_dispatch_waiting{queue="orders.commands"} 0.0' in metrics
    row = page.split('data-queue="inventory.commands"')[1].split("</tr>")[0]
    cells = [c.split(">")[-1] for c in row.split("</td>")[:-1]]
    assert cells[:4] == ["inventory.commands", "2", "2", "2"], cells


def test_a_saga_in_review_is_neither_waiting_for_capacity_nor_in_flight(settings):
    """``dispatch.counts`` counted every unsent row as waiting, paused ones too: a saga
    waiting for a person made ``SAGA_MAX_WAITING`` refuse every start of any saga type
    sending to that queue, while the participant was idle, and the waiting and oldest-wait
    gauges said commands were waiting for capacity that were waiting for a person."""
    app = build_order_app(dataclasses.replace(settings, max_in_flight="inventory=1", max_waiting=1))
    app.admission.refresh = 0  # read the counts at every start
    url = settings.broker_url
    try:
        a = to_reserve(app, url, "fp-a")  # A's reserve holds the only place
        b = in_review_with_its_reserve_waiting(app, url, "fp-b")
        (a_reserve,) = drain(url, "inventory.commands")
        run_command(app, a_reserve)
        (reply,) = drain(url, "saga.replies")
        run_reply(app, reply)  # the participant is idle: nothing of A's is out
        assert drain(url, "inventory.commands") == [], "B waits for a person, not for room"
        with TestClient(create_web_app(app), headers=AUTH) as client:
            metrics = client.get("/metrics").text
        assert 'saga_dispatch_waiting{queue="inventory.commands"} 0.0' in metrics
        assert 'saga_dispatch_oldest_wait_seconds{queue="inventory.commands"} 0.0' in metrics
        assert 'saga_dispatch_in_flight{queue="inventory.commands"} 0.0' in metrics
        assert 'saga_dispatch_paused{queue="inventory.commands"} 1.0' in metrics
        assert app.start_saga("order", "fp-c", ORDER).created, "refused for B's person"
        assert app.orchestrator.get(a.saga_id).status is SagaStatus.RUNNING
        assert app.orchestrator.get(b.saga_id).status is SagaStatus.MANUAL_REVIEW
    finally:
        app.close()
