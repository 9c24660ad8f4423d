"""A database outage, whole or partial, never dead-letters a message, on either queue type.

The outage is made on this test's database only (other tests share the server):
``ALLOW_CONNECTIONS false`` and the open sessions ended, or a row lock held by the test
against a ``lock_timeout`` / ``statement_timeout`` set on the database. The worker is
the same process before, during and after the outage: it must pick the message up again
by itself once the database answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from saga_tasks.core.states import SagaStatus
from saga_tasks.messaging.topology import QUORUM_DELIVERY_LIMIT
from saga_tasks.testing import queue_depths, wait_for, wait_for_status
from tests.helpers import ADMIN_URL, ORDER, assert_each_effect_once, build_order_app, rows

HOLDING = ["saga.dead_letter", "saga.parking_lot"]


def _admin():
    return create_engine(ADMIN_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")


@contextmanager
def database_away(database_url: str) -> Iterator[None]:
    """No session can reach this test's database until the block ends."""
    name = make_url(database_url).database
    engine = _admin()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        yield
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        engine.dispose()


def deliveries(worker) -> int:
    """Replies the worker received: Celery logs one line for each delivery."""
    lines = worker.log_text().splitlines()
    return sum(
        1 for line in lines if "Task saga_tasks.reply[" in line and line.endswith("received")
    )


def dead_or_tried(app, worker, times: int):
    """Wait for either: the message is held (the defect), or it was tried ``times`` times."""

    def check():
        depths = queue_depths(app.settings.broker_url, HOLDING)
        if any(depths.values()):
            return f"held: {depths}"
        return deliveries(worker) >= times and "tried"

    return check


def reply_waiting(app) -> bool:
    return queue_depths(app.settings.broker_url, ["saga.replies"])["saga.replies"] == 1


def test_a_database_outage_never_dead_letters_on_a_quorum_queue(settings, workers):
    quorum = dataclasses.replace(settings, queue_type="quorum")
    app = build_order_app(quorum)
    try:
        env = {"SAGA_QUEUE_TYPE": "quorum"}
        workers.participants(env=env)
        handle = app.start_saga("order", "outage-quorum", ORDER)
        wait_for(lambda: reply_waiting(app), timeout=30, describe="the first reply queued")
        with database_away(settings.database_url):
            orchestrator = workers.orchestrator(env=env)
            # More tries than the quorum queue's delivery limit allows deliveries.
            times = QUORUM_DELIVERY_LIMIT + 3
            found = wait_for(
                dead_or_tried(app, orchestrator, times),
                timeout=90,
                describe=f"the reply tried {times} times during the outage",
            )
            assert found == "tried", f"the outage dead-lettered the reply ({found})"
        # The same worker, the same message: it goes on once the database is back.
        wait_for_status(app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
        assert_each_effect_once(app, 1)
        assert queue_depths(settings.broker_url, HOLDING) == dict.fromkeys(HOLDING, 0)
        assert rows(app.engine, "SELECT id FROM saga.held_message") == []
        assert rows(app.engine, "SELECT * FROM saga.redelivery") == []
    finally:
        app.close()


@pytest.mark.parametrize("timeout_setting", ["lock_timeout", "statement_timeout"])
def test_a_partial_outage_is_not_counted_as_poison_on_a_classic_queue(
    order_app, settings, workers, timeout_setting
):
    app = order_app
    name = make_url(settings.database_url).database
    admin = _admin()
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" SET {timeout_setting} = 200'))
    workers.participants()
    handle = app.start_saga("order", f"partial-{timeout_setting}", ORDER)
    wait_for(lambda: reply_waiting(app), timeout=30, describe="the first reply queued")
    locker = create_engine(settings.database_url, poolclass=NullPool)
    try:
        with locker.connect() as conn, conn.begin():
            # The saga row stays locked: every try of the reply times out waiting for it.
            conn.execute(
                text("SELECT 1 FROM saga.saga_instance WHERE saga_id = :s FOR UPDATE"),
                {"s": handle.saga_id},
            )
            orchestrator = workers.orchestrator()
            # SAGA_POISON_LIMIT=2 in tests: more tries than that many redeliveries.
            found = wait_for(
                dead_or_tried(app, orchestrator, settings.poison_limit + 3),
                timeout=90,
                describe="the reply tried while the saga row is locked",
            )
            assert found == "tried", f"the partial outage dead-lettered the reply ({found})"
    finally:
        locker.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" RESET {timeout_setting}'))
        admin.dispose()
    wait_for_status(app, handle.saga_id, [SagaStatus.COMPLETED], timeout=60)
    assert_each_effect_once(app, 1)
    assert queue_depths(settings.broker_url, HOLDING) == dict.fromkeys(HOLDING, 0)
    assert rows(app.engine, "SELECT id FROM saga.held_message") == []
