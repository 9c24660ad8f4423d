"""Review: a start that joined the caller's session is published once it commits.

``after_commit`` fires when a savepoint is released too (SQLAlchemy dispatches it for
nested transactions). The hook then looks the saga up on another connection, finds
nothing yet (the outer transaction is still open), logs that the start rolled back, and
is gone (``once=True``). When the outer transaction commits, nothing publishes the
start's commands: they wait for outbox recovery.
"""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from saga_tasks.testing import queue_depths
from tests.integration.helpers import ORDER, scalar

UNPUBLISHED = "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL"


@pytest.mark.xfail(
    strict=True,
    reason="_publish_if_committed runs on the savepoint's release, sees no committed row, "
    "and unhooks itself: the outer commit publishes nothing (recovery sends it later)",
)
def test_a_start_in_a_released_savepoint_is_published_when_the_transaction_commits(
    order_app, settings
):
    with Session(order_app.engine) as session, session.begin(), session.begin_nested():
        handle = order_app.start_saga("order", "tx-sp-ok", ORDER, session=session)
        # Leaving the block releases the savepoint, then commits the outer transaction.
    assert order_app.flush()
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 1
    assert scalar(order_app.engine, UNPUBLISHED) == 0, f"saga {handle.saga_id} waits for recovery"
    assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 1}


@pytest.mark.xfail(
    strict=True,
    reason="a session joined to an outer connection transaction (create_savepoint) fires "
    "after_commit on its own commit, before the outer commit: the start is not published",
)
def test_a_start_in_a_session_joined_to_an_outer_transaction_is_published_after_it(
    order_app, settings
):
    with order_app.engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            order_app.start_saga("order", "tx-outer", ORDER, session=session)
            session.commit()
        outer.commit()
    assert order_app.flush()
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 1
    assert scalar(order_app.engine, UNPUBLISHED) == 0, "the commands wait for recovery"
    assert queue_depths(settings.broker_url, ["orders.commands"]) == {"orders.commands": 1}
