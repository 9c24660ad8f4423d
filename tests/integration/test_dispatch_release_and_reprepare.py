"""Flow control's release in ``saga.dispatch_release`` (migration 0006), with
``saga_dispatch.paused`` written by the decision statement, and the re-PREPARE of prepared
statements at doubling intervals: each test pins one defect that was found there."""

from __future__ import annotations

import dataclasses
import time

import pytest
from sqlalchemy import Integer, column

from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import ConcurrencyConflict
from saga_tasks.ops.operator import act
from saga_tasks.persistence.prepared import Prepared
from tests.helpers import (
    ORDER,
    PARTICIPANTS,
    drain,
    rows,
    run_command,
    run_reply,
    to_reserve,
)

INVENTORY = "inventory.commands"


# -- a held command written in the statement that leaves the saga in review ----------------


def pivot_saga():
    """A saga whose pivot comes first, then two steps side by side: a refusal of one
    after the pivot sends the saga to a person (nothing is compensated after a pivot)."""
    from participants import inventory, orders, payments
    from participants.order_saga import OrderPayload
    from saga_tasks import saga, step

    return saga(
        "pivoted",
        step("create_order", orders.create, compensation=orders.cancel, timeout=30, pivot=True),
        step(
            "reserve_stock",
            inventory.reserve,
            compensation=inventory.release,
            timeout=30,
            depends_on=["create_order"],
        ),
        step(
            "authorize_payment",
            payments.authorize,
            compensation=payments.void,
            timeout=60,
            retry=1,
            depends_on=["create_order"],
        ),
        version=1,
        timeout=600,
        payload=OrderPayload,
    )


def build_app(settings, clock):
    from participants.faults import DemoFaults
    from participants.order_saga import order_saga
    from participants.seed import seed
    from saga_tasks import SagaApp
    from saga_tasks.messaging.topology import declare_topology

    app = SagaApp(
        sagas=[order_saga(), pivot_saga()],
        participants=list(PARTICIPANTS),
        settings=dataclasses.replace(settings, max_in_flight="inventory=1"),
        clock=clock,
        hooks=DemoFaults(enabled=False),
    )
    declare_topology(settings.broker_url, app.topology)
    seed(app.participant_engine)
    app.sweeper._backlog = dict
    return app


def live_rows(app, saga_id):
    return rows(
        app.engine,
        "SELECT step, task_name AS task, sent_at, paused FROM saga.saga_dispatch "
        "WHERE saga_id = CAST(:s AS uuid) AND withdrawn_at IS NULL ORDER BY created_at",
        s=saga_id,
    )


def test_a_fence_held_by_a_decision_that_leaves_the_saga_in_review_waits_for_its_person(
    settings, clock
):
    """``pause_sql`` marks the rows of each saved saga from its new status, but a CTE
    does not see the rows the same statement inserts (``held``): "a command held by the
    same decision is written not paused: only a running or compensating saga sends one".
    A decision can hold a command and leave its saga in MANUAL_REVIEW: an operator skips
    (does by hand) a step whose command still waits for capacity, so its fence is held;
    ``advance`` then finds a step that failed after the pivot and puts the saga straight
    back in review. The fence's row is written ``paused = false``: the release (which no
    longer looks at the saga's status) sends it while the saga waits for its person,
    and it then counts in flight for a saga in review. Before the change the release
    joined saga_instance and held it back."""
    app = build_app(settings, clock)
    url = settings.broker_url
    try:
        to_reserve(app, url, "pz-blocker")
        (blocker,) = drain(url, INVENTORY)  # holds the only inventory place, unanswered
        x = app.start_saga("pivoted", "pz-x", {**ORDER, "customer_id": "nobody-at-all"})
        run_command(app, drain(url, "orders.commands")[0])
        run_reply(app, drain(url, "saga.replies")[0])  # the pivot: reserve + authorize
        assert [r["step"] for r in live_rows(app, x.saga_id)] == ["reserve_stock"]
        (authorize,) = drain(url, "payments.commands")
        run_command(app, authorize)  # declined: unknown customer
        run_reply(app, drain(url, "saga.replies")[0])
        state = app.orchestrator.get(x.saga_id)
        assert state.status is SagaStatus.MANUAL_REVIEW, state.reason
        assert [r["paused"] for r in live_rows(app, x.saga_id)] == [True]

        act(app, x.saga_id, "skip_step", step="reserve_stock", actor="ana",
            reason="reserved by hand", expect_version=state.version)  # fmt: skip
        after = app.orchestrator.get(x.saga_id)
        assert after.status is SagaStatus.MANUAL_REVIEW, "failed after the pivot: review"
        assert after.steps["reserve_stock"].fencing
        live = live_rows(app, x.saga_id)
        assert [(r["task"], r["sent_at"]) for r in live] == [("inventory.release", None)]

        # The blocker answers: the place frees, and the release runs for inventory.
        run_command(app, blocker)
        run_reply(app, drain(url, "saga.replies")[0])
        sent = [m["headers"]["task"] for m in drain(url, INVENTORY)
                if m["headers"]["saga_id"] == x.saga_id]  # fmt: skip
        assert app.orchestrator.get(x.saga_id).status is SagaStatus.MANUAL_REVIEW
        assert sent == [], f"a saga in MANUAL_REVIEW had {sent} released on its own"
        assert [r["paused"] for r in live_rows(app, x.saga_id)] == [True], (
            "a row of a saga in review is written, and stays, paused = false"
        )
    finally:
        app.close()


# -- a statement re-prepared when its session lost it --------------------------------------

ADD = Prepared("test_review_add", "SELECT CAST(:a AS integer) + :b AS n",
               {"a": "integer", "b": "integer"}, [column("n", Integer)])  # fmt: skip


def test_a_session_that_lost_its_statements_when_a_replan_is_due_retries_not_sticks(
    settings, clock
):
    """The module's promise: "A statement that went missing anyway (DISCARD ALL) fails
    its transaction as a ConcurrencyConflict, which retries the message; the retry
    prepares it again". Once its re-plan is due, ``Prepared.execute`` first runs
    ``DEALLOCATE name`` outside the ``try`` that turns 26000 into ConcurrencyConflict and
    forgets the session's names: the DEALLOCATE of the lost statement fails with a raw
    InvalidSqlStatementName, the entry stays due, and every later call on that pooled
    connection runs the same DEALLOCATE and fails again: a stuck connection (behind
    PgBouncer in transaction mode with SAGA_DB_PREPARE left on, each server connection
    switch does it)."""
    from saga_tasks.persistence.db import get_engine

    engine = get_engine(settings.database_url)
    with engine.connect() as conn:
        assert ADD.execute(conn, {"a": 1, "b": 2}).scalar_one() == 3
        conn.commit()
        names = conn.connection.info["saga_tasks.prepared"]
        _due, interval = names[ADD.name]
        names[ADD.name] = (time.monotonic() - 1, interval)  # its 5 s are up: re-plan due
        conn.exec_driver_sql("DEALLOCATE ALL")  # what DISCARD ALL or a pooler does to it
        conn.commit()
        with pytest.raises(ConcurrencyConflict):  # the message is retried
            ADD.execute(conn, {"a": 1, "b": 2})
        conn.rollback()
        assert ADD.execute(conn, {"a": 1, "b": 2}).scalar_one() == 3, "the retry prepares again"
