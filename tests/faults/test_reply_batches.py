"""Group commit of replies (``worker.batching``) through real workers: replies the
orchestrator holds are applied in one transaction, a bad one fails alone, and a kill at
any point of a batch loses and doubles nothing.

Replies are made to pile up first (the participants run, the orchestrator does not), so
the orchestrator starts with a queue of them and holds 16 at a time (``SAGA_REPLY_BATCH``
raises its prefetch to a batch): batches fill. Rows one
transaction wrote share its ``xmin``: the number of distinct ``xmin`` among the first
step's successes is the number of transactions that applied those replies.
"""

from __future__ import annotations

import json
import signal
import uuid

import pytest
from kombu import Connection
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from saga_tasks.testing import wait_for
from tests.helpers import (
    ORDER,
    assert_each_effect_once,
    pile_up,
    rows,
    scalar,
    statuses,
    wait_for_lock_waiter,
)

BATCHING = {"SAGA_PREFETCH_MULTIPLIER": "4", "SAGA_REPLY_BATCH": "16"}
"""A prefetch of 4 asked for: a worker that batches replies holds a batch all the same."""
FIRST_STEP_COMMITS = (
    "SELECT count(DISTINCT xmin::text) FROM saga.saga_history "
    "WHERE event = 'step_succeeded' AND step = 'create_order'"
)


LARGEST_FIRST_STEP_BATCH = (
    "SELECT max(n) FROM (SELECT count(*) AS n FROM saga.saga_history "
    "WHERE event = 'step_succeeded' AND step = 'create_order' GROUP BY xmin::text) AS batches"
)


def _pile_up_replies(order_app, workers, count: int, *, first: int = 0, payload=None) -> list:
    """Start ``count`` sagas and wait until their first step's replies wait in the queue."""
    return pile_up(order_app, "saga.replies", [payload or ORDER] * count, first=first)


def _all_completed(order_app, sagas: int) -> None:
    wait_for(
        lambda: statuses(order_app) == {"COMPLETED": sagas},
        timeout=120,
        describe=lambda: f"every saga COMPLETED (now {statuses(order_app)})",
    )


@pytest.mark.timeout(180)
def test_replies_held_together_commit_together(order_app, workers):
    sagas = 24
    workers.participants()
    _pile_up_replies(order_app, workers, sagas)

    workers.orchestrator(env=BATCHING)
    _all_completed(order_app, sagas)

    assert_each_effect_once(order_app, sagas)
    commits = scalar(order_app.engine, FIRST_STEP_COMMITS)
    assert commits < sagas / 2, f"{sagas} waiting replies applied in {commits} transactions"
    largest = scalar(order_app.engine, LARGEST_FIRST_STEP_BATCH)
    assert largest > 4, f"no batch larger than the prefetch of 4 asked for ({largest})"


@pytest.mark.timeout(180)
def test_one_bad_reply_in_a_batch_fails_alone(order_app, workers, settings):
    sagas = 16
    workers.participants()
    _pile_up_replies(order_app, workers, sagas // 2)
    unknown_saga = str(uuid.uuid4())
    with Connection(settings.broker_url) as conn:
        channel = conn.channel()
        for message_id, headers in (
            ("m-no-headers", {}),
            (
                "m-unknown-saga",
                {
                    "saga_id": unknown_saga,
                    "saga_step": "create_order",
                    "saga_message_kind": "reply",
                    "saga_reply_to_kind": "command",
                    "saga_command_id": unknown_saga,
                },
            ),
        ):
            message = channel.prepare_message(
                json.dumps([[], {"outcome": "success"}, {}]),
                content_type="application/json",
                content_encoding="utf-8",
                headers={"task": "saga_tasks.reply", "id": message_id, **headers},
            )
            channel.basic_publish(message, exchange="saga.replies", routing_key="reply.saga.v1")
        channel.close()
    _pile_up_replies(order_app, workers, sagas // 2, first=sagas // 2)

    orchestrator = workers.orchestrator(env=BATCHING)
    _all_completed(order_app, sagas)

    assert_each_effect_once(order_app, sagas)
    reasons = {
        r["message_id"]: r["reason"]
        for r in rows(order_app.engine, "SELECT message_id, reason FROM saga.invalid_message")
    }
    assert reasons == {
        "m-no-headers": "missing or empty header 'saga_id'",
        "m-unknown-saga": f"reply for unknown saga {unknown_saga}",
    }
    assert "rolled back (InvalidMessage" in orchestrator.log_text()
    # The batch they were in was applied reply by reply; the rest were batched still.
    assert scalar(order_app.engine, FIRST_STEP_COMMITS) < sagas


@pytest.mark.timeout(180)
def test_orchestrator_killed_while_a_batch_waits_mid_transaction(order_app, workers):
    """SIGKILL while a batch's transaction is open (it waits for a saga row the test
    holds): nothing of the batch committed, every reply is redelivered and applied once."""
    sagas = 24
    workers.participants()
    handles = _pile_up_replies(order_app, workers, sagas)
    held = max(h.saga_id for h in handles)  # locked last in whichever batch it is in

    with order_app.engine.connect() as blocker:
        blocker.execute(
            text("SELECT 1 FROM saga.saga_instance WHERE saga_id = :s FOR UPDATE"), {"s": held}
        )
        orchestrator = workers.orchestrator(env=BATCHING)
        wait_for_lock_waiter(order_app.engine, "a batch waiting for the saga row the test holds")
        orchestrator.kill(signal.SIGKILL)
        blocker.rollback()

    workers.orchestrator(env=BATCHING)
    _all_completed(order_app, sagas)
    assert_each_effect_once(order_app, sagas)


@pytest.mark.demo_faults
@pytest.mark.timeout(180)
def test_orchestrator_killed_after_a_batch_committed(order_app, workers):
    """SIGKILL after the batch's commit, before any of its commands is published or any
    reply acked: the replies come again and are ignored as duplicates, and the commands
    leave from the outbox (recovery), once each."""
    sagas = 16
    workers.beat()  # outbox recovery: the batch's commands were committed, never sent
    workers.participants()
    _pile_up_replies(order_app, workers, sagas - 1)
    crashing = {**ORDER, "demo_faults": {"saga_tasks.reply@create_order": "crash_after_commit"}}
    _pile_up_replies(order_app, workers, 1, first=sagas, payload=crashing)

    orchestrator = workers.orchestrator(env=BATCHING)
    wait_for(lambda: not orchestrator.alive(), timeout=60, describe="the orchestrator to crash")
    neighbours = scalar(
        order_app.engine,
        "SELECT count(*) - 1 FROM saga.saga_history WHERE event = 'step_succeeded' "
        "AND step = 'create_order' AND xmin = (SELECT xmin FROM saga.saga_history h "
        "JOIN saga.saga_instance s USING (saga_id) WHERE s.business_key = :k "
        "AND h.event = 'step_succeeded' AND h.step = 'create_order')",
        k=f"b-{sagas}",
    )
    assert neighbours > 0, "the crashing reply was applied in a batch of its own"

    workers.orchestrator(env=BATCHING)
    _all_completed(order_app, sagas)
    assert_each_effect_once(order_app, sagas)
    duplicates = scalar(
        order_app.engine,
        "SELECT count(*) FROM saga.saga_history WHERE event = 'duplicate_message'",
    )
    assert duplicates >= neighbours + 1, "every reply of the committed batch came again"


@pytest.mark.timeout(180)
def test_a_prefork_orchestrator_applies_each_reply_as_a_task(order_app, workers):
    """The prefork parent forks the pool's children: it never opens a database
    connection or a sender thread to apply a batch, so every reply runs in a child."""
    sagas = 12
    workers.participants()
    _pile_up_replies(order_app, workers, sagas)

    workers.orchestrator(pool="prefork", concurrency=2, env=BATCHING)
    _all_completed(order_app, sagas)

    assert_each_effect_once(order_app, sagas)
    assert scalar(order_app.engine, FIRST_STEP_COMMITS) == sagas


@pytest.mark.timeout(180)
def test_a_batch_waiting_for_a_saga_holds_no_queue_lock(order_app, workers):
    """Flow control (on by default) releases a queue's waiting commands under that
    queue's advisory lock, held until commit. Every deciding transaction (one reply, an
    operator's action, the sweeper) locks its sagas first and its queues after. A batch
    must keep that order: one that took a queue's lock for an earlier reply and then
    waits for a saga such a transaction holds closes a cycle (a deadlock: one of the two
    is rolled back by PostgreSQL)."""
    sagas = 24
    workers.participants()
    handles = _pile_up_replies(order_app, workers, sagas)
    held = max(h.saga_id for h in handles)  # locked last in whichever batch it is in
    touched = ["inventory.commands", "orders.commands"]  # a create_order reply's queues
    assert set(touched) <= set(order_app.orchestrator.flow.limits)

    with order_app.engine.connect() as other:
        # Another deciding transaction on `held`: its saga locked first...
        other.execute(
            text("SELECT 1 FROM saga.saga_instance WHERE saga_id = :s FOR UPDATE"), {"s": held}
        )
        orchestrator = workers.orchestrator(env=BATCHING)
        wait_for_lock_waiter(order_app.engine, "a batch waiting for the saga row the test holds")
        # ... then the release of the queues its decision touched, as _write_decision does.
        try:
            order_app.orchestrator.flow.release(other, touched)
        except OperationalError as exc:
            pytest.fail(f"the batch and a one-saga transaction deadlocked: {exc.orig}")
        finally:
            other.rollback()

    _all_completed(order_app, sagas)
    assert_each_effect_once(order_app, sagas)
    # PostgreSQL breaks a deadlock by rolling back one side: the test's (above) or the batch.
    assert "rolled back (ConcurrencyConflict" not in orchestrator.log_text()


@pytest.mark.timeout(60)
def test_a_refused_sender_in_a_batch_is_counted_once(order_app, settings):
    """A batch holding a reply from a refused sender rolls back whole, and the batcher
    hands each of its messages to the reply task (``handle_reply``), which refuses and
    counts that one: the batch itself must count nothing (nothing of a rolled-back
    batch is written, counted or sent). Both refusal points: a stranger (checked before
    anything), and a service user that does not own the step's queue (checked once the
    saga is locked). The batcher's sequence, replayed in this process."""
    from saga_tasks.core.senders import Senders
    from saga_tasks.errors import SenderRefused
    from saga_tasks.observability import metrics
    from saga_tasks.persistence.tables import ORCHESTRATOR
    from saga_tasks.runtime.orchestrator import DeliveredReply
    from tests.helpers import drain, run_command

    url = settings.broker_url
    order_app.start_saga("order", "b-refused", ORDER)
    run_command(order_app, drain(url, "orders.commands")[0])
    (reply,) = drain(url, "saga.replies")
    orchestrator = order_app.orchestrator
    orchestrator.senders = Senders(
        prefix="t-", participants={"orders.commands": "orders", "inventory.commands": "inventory"}
    )
    refused = metrics.SENDERS_REFUSED.labels(consumer=ORCHESTRATOR)
    before = refused._value.get()
    for sender in ("t-intruder", "t-inventory"):
        headers, kwargs = reply["headers"], reply["kwargs"]
        with pytest.raises(SenderRefused):  # the batch: rolled back
            orchestrator.handle_replies(
                [DeliveredReply(headers["id"], headers, kwargs, sender=sender)]
            )
        with pytest.raises(SenderRefused):  # then the reply task, alone
            orchestrator.handle_reply(
                headers["id"], headers, kwargs, raise_invalid=True, sender=sender
            )
    assert refused._value.get() - before == 2, "each refused reply counted once"
