"""Flow control across deploys that change its settings, over real PostgreSQL and RabbitMQ:
a command held under one deployment's limit and answered (or withdrawn) under one without
any gives its place back all the same, so a later deployment with a limit does not count
it in flight for good.

Each test deploys the order saga three times on one database: ``inventory=1``, then
``SAGA_MAX_IN_FLIGHT=0`` (flow control off), then, where it matters, ``inventory=1`` again."""

from __future__ import annotations

import dataclasses

import pytest

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.ops.operator import act
from tests.helpers import (
    build_order_app,
    drain,
    in_review_with_its_reserve_waiting,
    rows,
    run_command,
    run_reply,
    to_reserve,
)

INVENTORY = "inventory.commands"


@pytest.fixture
def deploy(settings, clock):
    """A deployment of the order saga with ``SAGA_MAX_IN_FLIGHT=limit``; each closed after
    the test (a test closes one itself when the next takes over)."""
    apps = []

    def build(limit: str):
        app = build_order_app(dataclasses.replace(settings, max_in_flight=limit), clock=clock)
        app.sweeper._backlog = dict  # about flow control alone, not the backlog check
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def dispatch_rows(app, saga_id):
    return rows(
        app.engine,
        "SELECT step, task_name AS task, sent_at IS NOT NULL AS sent, "
        "withdrawn_at IS NOT NULL AS withdrawn, paused FROM saga.saga_dispatch "
        "WHERE saga_id = :s ORDER BY created_at",
        s=saga_id,
    )


def test_a_place_held_under_a_limit_is_given_back_when_answered_without_one(deploy, settings):
    """``FlowControl.stage`` returned before freeing anything when no queue had a limit:
    A's reserve, sent under ``inventory=1`` and answered with flow control off, kept its
    sent row; A goes on (running), so the row counts in flight under the next limit, and
    B's reserve waits behind an answer given long ago (with the limit's number of such
    rows, the queue gets nothing more, compensations included)."""
    url = settings.broker_url
    first = deploy("inventory=1")
    a = to_reserve(first, url, "fs-a")
    (a_reserve,) = drain(url, INVENTORY)
    first.close()

    off = deploy("0")
    run_command(off, a_reserve)
    (reply,) = drain(url, "saga.replies")
    run_reply(off, reply)
    state = off.orchestrator.get(a.saga_id)
    assert state.status is SagaStatus.RUNNING
    assert state.steps["reserve_stock"].status is StepStatus.SUCCEEDED
    assert dispatch_rows(off, a.saga_id) == [], "the answer gave A's place back"
    off.close()

    again = deploy("inventory=1")
    b = to_reserve(again, url, "fs-b")
    again.sweeper.sweep()
    out = [m["headers"]["saga_id"] for m in drain(url, INVENTORY)]
    assert out == [b.saga_id], "B's reserve waited behind A's, answered under no limit"


def test_a_saga_ended_without_a_limit_withdraws_what_waited(deploy, settings):
    """A saga in review, its reserve waiting, resolved with flow control off: its waiting
    row was left (paused) instead of withdrawn, a command decided that is on record as
    neither sent nor given up."""
    url = settings.broker_url
    first = deploy("inventory=1")
    to_reserve(first, url, "fe-a")  # A's reserve holds the only place
    b = in_review_with_its_reserve_waiting(first, url, "fe-b")
    assert [(r["sent"], r["withdrawn"], r["paused"]) for r in dispatch_rows(first, b.saga_id)] == [
        (False, False, True)
    ]
    first.close()

    off = deploy("0")
    state = off.orchestrator.get(b.saga_id)
    act(off, b.saga_id, "resolve", actor="ana", reason="refunded by hand",
        expect_version=state.version, resolution="FAILED")  # fmt: skip
    assert [(r["sent"], r["withdrawn"]) for r in dispatch_rows(off, b.saga_id)] == [
        (False, True)
    ], "the reserve of a saga that ended still waits"


def test_a_command_withdrawn_without_a_limit_is_never_sent(deploy, settings):
    """B's reserve waits under ``inventory=1``; with flow control off an operator does the
    step by hand, so its fence goes out and the waiting reserve is superseded. The old
    stage marked nothing: the reserve stayed waiting, and the next sweep (which sends what
    waits at a queue without a limit) sent it after the step was done by hand."""
    url = settings.broker_url
    first = deploy("inventory=1")
    to_reserve(first, url, "fw-a")
    b = to_reserve(first, url, "fw-b")
    assert len(drain(url, INVENTORY)) == 1, "A's reserve; B's waits"
    first.close()

    off = deploy("0")
    state = off.orchestrator.get(b.saga_id)
    act(off, b.saga_id, "skip_step", step="reserve_stock", actor="ana",
        reason="reserved by hand", expect_version=state.version)  # fmt: skip
    off.sweeper.sweep()
    sent = [m["headers"]["task"] for m in drain(url, INVENTORY)]
    assert sent == ["inventory.release"], "only the fence; the reserve was withdrawn"
    assert [(r["task"], r["withdrawn"]) for r in dispatch_rows(off, b.saga_id)] == [
        ("inventory.reserve", True)
    ]
