"""Publish-after-commit by the sender thread, and pooled connections after a restart,
against real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from kombu import Connection
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from saga_tasks import SagaApp
from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import ServiceUnavailable
from saga_tasks.messaging.dispatcher import Dispatcher
from saga_tasks.messaging.topology import declare_topology
from saga_tasks.observability import metrics
from saga_tasks.persistence import db
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.runtime.outlet import SyncOutlet, relay
from tests.helpers import ADMIN_URL, ORDER, drain, pump, scalar


def _failures() -> float:
    return metrics.PUBLISH_FAILURES.labels(path="after_commit")._value.get()


def test_the_sender_thread_publishes_and_marks_after_commit(order_app, settings):
    assert isinstance(order_app.outlet, Dispatcher)
    handles = [order_app.start_saga("order", f"d-{i}", ORDER) for i in range(20)]
    assert order_app.flush(10)
    engine = order_app.engine
    assert scalar(engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 0
    assert scalar(engine, "SELECT max(publish_attempts) FROM saga.outbox") == 1
    messages = drain(settings.broker_url, "orders.commands")
    assert sorted(m["headers"]["saga_id"] for m in messages) == sorted(h.saga_id for h in handles)
    # A Celery protocol 2 task message: the worker needs nothing more, stores no result.
    headers = messages[0]["headers"]
    assert headers["task"] == "orders.create"
    assert headers["ignore_result"] is True
    assert headers["id"] == headers["root_id"]


def test_an_unroutable_message_is_left_to_recovery(order_app, settings, caplog):
    with Connection(settings.broker_url) as conn:
        conn.default_channel.queue_delete("orders.commands")
    before = _failures()
    with caplog.at_level(logging.WARNING, logger="saga_tasks.dispatcher"):
        handle = order_app.start_saga("order", "unroutable", ORDER)
        assert order_app.flush(10)
    engine = order_app.engine
    assert scalar(engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 1
    assert _failures() == before + 1
    returned = [r for r in caplog.records if "returned unroutable" in r.getMessage()]
    assert returned and getattr(returned[0], "message_id", None)
    given_up = [r for r in caplog.records if "not confirmed" in r.getMessage()]
    assert given_up and given_up[0].saga_id == handle.saga_id

    declare_topology(settings.broker_url, order_app.topology)
    report = relay(engine, saga_outbox, order_app.publisher, min_age_seconds=0, batch=10)
    assert report.published == 1
    (command,) = drain(settings.broker_url, "orders.commands")
    assert command["headers"]["saga_id"] == handle.saga_id


def test_with_the_broker_unreachable_the_rows_wait_for_recovery(order_app, settings):
    away = SagaApp(
        sagas=list(order_app.registry),
        settings=replace(
            settings, broker_url="amqp://guest:guest@127.0.0.1:5999//", publish_timeout=1.0
        ),
    )
    try:
        before = _failures()
        handle = away.start_saga("order", "away", ORDER)
        assert handle.created, "the start commits whether or not the broker is there"
        assert away.flush(10)
        assert _failures() == before + 1
    finally:
        away.close()
    engine = order_app.engine
    assert scalar(engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 1
    report = relay(engine, saga_outbox, order_app.publisher, min_age_seconds=0, batch=10)
    assert report.published == 1
    assert len(drain(settings.broker_url, "orders.commands")) == 1


def test_sync_publish_mode_marks_before_returning(order_app, settings):
    app = SagaApp(
        sagas=list(order_app.registry),
        participants=[r.participant for r in order_app.runtimes.values()],
        settings=replace(settings, publish_mode="sync"),
    )
    try:
        assert isinstance(app.outlet, SyncOutlet)
        handle = app.start_saga("order", "sync-1", ORDER)
        # No flush: the publish and the marking happened inside start_saga.
        assert (
            scalar(app.engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 0
        )
        pump(app, settings.broker_url)
        assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED
    finally:
        app.close()


def _kill_connections(database_url: str) -> int:
    name = make_url(database_url).database
    admin = create_engine(ADMIN_URL, poolclass=NullPool)
    try:
        with admin.begin() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": name},
                ).all()
            )
    finally:
        admin.dispose()


def test_a_connection_killed_while_idle_is_replaced_before_use(order_app, monkeypatch):
    order_app.start_saga("order", "before-restart", ORDER)
    order_app.flush()
    assert _kill_connections(order_app.settings.database_url) >= 1
    monkeypatch.setattr(db, "IDLE_PING_AFTER", 0.0)  # every connection counts as idle
    handle = order_app.start_saga("order", "after-restart", ORDER)
    assert handle.created


def test_a_connection_killed_while_busy_fails_one_transaction_only(order_app, monkeypatch):
    order_app.start_saga("order", "before-kill", ORDER)
    order_app.flush()
    monkeypatch.setattr(db, "IDLE_PING_AFTER", 3600.0)  # a busy worker: no ping
    assert _kill_connections(order_app.settings.database_url) >= 1
    with pytest.raises(ServiceUnavailable, match="PostgreSQL"):
        order_app.start_saga("order", "during-kill", ORDER)
    # The pool dropped the dead connections: the next transaction gets a fresh one.
    assert order_app.start_saga("order", "during-kill", ORDER).created
