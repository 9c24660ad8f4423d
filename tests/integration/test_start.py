"""Starting sagas against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import BusinessKeyConflict, InputError, InvalidPayload, UnknownSagaType
from saga_tasks.testing import queue_depths
from tests.helpers import ORDER, drain, rows, scalar


def test_start_writes_the_saga_and_publishes_the_first_command(order_app, settings):
    handle = order_app.start_saga("order", "o-1", ORDER)
    assert handle.created and handle.status is SagaStatus.RUNNING
    engine = order_app.engine
    assert scalar(engine, "SELECT count(*) FROM saga.saga_instance") == 1
    assert scalar(engine, "SELECT count(*) FROM saga.saga_step") == 4
    assert order_app.flush(), "the broker confirmed the command and the row is marked"
    assert scalar(engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NOT NULL") == 1
    events = [r["event"] for r in rows(engine, "SELECT event FROM saga.saga_history ORDER BY id")]
    assert events == ["saga_started", "step_requested"]
    (message,) = drain(settings.broker_url, "orders.commands")
    assert message["headers"]["task"] == "orders.create"
    assert message["headers"]["saga_id"] == handle.saga_id
    assert message["headers"]["saga_message_kind"] == "command"
    assert message["kwargs"]["saga_payload"]["customer_id"] == "c-1"


def test_same_business_key_returns_the_same_saga(order_app, settings):
    first = order_app.start_saga("order", "o-2", ORDER)
    again = order_app.start_saga("order", "o-2", dict(ORDER))
    assert (again.saga_id, again.created) == (first.saga_id, False)
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 1
    assert order_app.flush(), "the first command is confirmed by the broker"  # sent async
    assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 1}
    with pytest.raises(BusinessKeyConflict) as info:
        order_app.start_saga("order", "o-2", {**ORDER, "amount_cents": 5})
    assert info.value.saga_id == first.saga_id


def test_concurrent_starts_of_one_key_make_one_saga(order_app):
    handles = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        handles.append(order_app.start_saga("order", "race", ORDER))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({h.saga_id for h in handles}) == 1
    assert sum(h.created for h in handles) == 1
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 1


@pytest.mark.parametrize(
    ("saga_type", "key", "payload", "error", "message"),
    [
        (
            "order",
            "k",
            {"customer_id": "c-1", "items": [], "amount_cents": 1},
            InvalidPayload,
            "items",
        ),
        ("order", "k", {**ORDER, "surprise": 1}, InvalidPayload, "surprise"),
        ("order", "k", "not an object", InvalidPayload, "order"),
        ("order", "", ORDER, InputError, "business key"),
        ("refund", "k", ORDER, UnknownSagaType, "known: order"),
    ],
)
def test_bad_starts_are_refused_before_anything_is_written(
    order_app, saga_type, key, payload, error, message
):
    with pytest.raises(error, match=message):
        order_app.start_saga(saga_type, key, payload)
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 0


def test_demo_faults_are_refused_unless_enabled(order_app):
    """The production path: the example's hooks are installed but not enabled."""
    with pytest.raises(InvalidPayload, match="SAGA_TASKS_DEMO_FAULTS"):
        order_app.start_saga("order", "f", {**ORDER, "demo_faults": {"orders.create": "raise"}})
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 0


def test_start_joins_the_callers_session_commit(order_app, settings):
    with Session(order_app.engine) as session, session.begin():
        handle = order_app.start_saga("order", "tx-1", ORDER, session=session)
        # Nothing is visible to others or published before the caller commits.
        assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 0
        assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 0}
    assert scalar(order_app.engine, "SELECT status FROM saga.saga_instance") == "RUNNING"
    (message,) = drain(settings.broker_url, "orders.commands")
    assert message["headers"]["saga_id"] == handle.saga_id
    assert (
        scalar(order_app.engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 0
    )


def test_start_joins_the_callers_session_rollback(order_app, settings):
    with Session(order_app.engine) as session:
        session.begin()
        order_app.start_saga("order", "tx-2", ORDER, session=session)
        session.rollback()
    assert order_app.flush()
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 0
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.outbox") == 0
    assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 0}


def test_a_start_in_a_rolled_back_savepoint_sends_nothing(order_app, settings):
    with Session(order_app.engine) as session, session.begin(), session.begin_nested() as sp:
        order_app.start_saga("order", "tx-sp", ORDER, session=session)
        sp.rollback()
    assert order_app.flush()
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 0
    assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 0}


def test_a_rolled_back_start_sends_nothing_when_the_session_commits_later(order_app, settings):
    with Session(order_app.engine) as session:
        session.begin()
        order_app.start_saga("order", "tx-rb", ORDER, session=session)
        session.rollback()
        with session.begin():  # unrelated work on the same session
            session.execute(text("SELECT 1"))
    assert order_app.flush()
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 0
    assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 0}
