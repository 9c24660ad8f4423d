"""Flow control's waiting commands: fences, resends, replays and lifted limits at the edge.

Every test runs the order saga with at most one inventory command out at once, so a
second saga's reserve_stock (or fence, or compensation) waits in saga.saga_dispatch."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.ops.operator import act
from saga_tasks.runtime.holding import DEAD_LETTER
from tests.helpers import (
    ORDER,
    build_order_app,
    drain,
    held,
    reject_one,
    rows,
    run_command,
    run_reply,
    scalar,
    to_reserve,
)

INVENTORY = "inventory.commands"


@pytest.fixture
def one_out(settings, clock):
    """At most one inventory command sent and unanswered; the backlog check off."""
    app = build_order_app(dataclasses.replace(settings, max_in_flight="inventory=1"), clock=clock)
    app.sweeper._backlog = dict
    yield app
    app.close()


def waiting_rows(app, saga_id=None):
    return rows(
        app.engine,
        "SELECT saga_id::text, step, task_name AS task, sent_at FROM saga.saga_dispatch "
        "WHERE sent_at IS NULL AND withdrawn_at IS NULL "
        "AND (CAST(:s AS uuid) IS NULL OR saga_id = CAST(:s AS uuid))",
        s=saga_id,
    )


def test_a_fence_waiting_for_capacity_spends_no_attempt(one_out, clock, settings):
    """A fence (the compensation that fences the command of a step done by hand) that
    still waits for capacity is chased like one sent and unanswered: every deadline it
    is "re-sent" (fence_resent, compensation_attempt + 1) though it never left, and once
    its attempts are spent the saga goes to MANUAL_REVIEW ("its effect may be doubled").
    ``_Due.add`` only explains REQUESTED/COMPENSATING steps by flow control, not fences."""
    app, url = one_out, settings.broker_url
    # A sustained backlog: the reserve of saga A, sent and on its worker, is not chased.
    app.sweeper._backlog = lambda: {INVENTORY: 1}
    to_reserve(app, url, "ff-a")  # A's reserve holds the only place
    assert len(drain(url, INVENTORY)) == 1
    b = to_reserve(app, url, "ff-b")  # B's reserve waits for capacity
    assert [r["step"] for r in waiting_rows(app, b.saga_id)] == ["reserve_stock"]
    state = app.orchestrator.get(b.saga_id)
    act(app, b.saga_id, "skip_step", step="reserve_stock", actor="ana",
        reason="reserved by hand", expect_version=state.version)  # fmt: skip
    assert [r["task"] for r in waiting_rows(app, b.saga_id)] == ["inventory.release"]
    fence = app.orchestrator.get(b.saga_id).steps["reserve_stock"]
    assert fence.fencing and fence.compensation_attempt == 1
    clock.advance(31)  # past the fence's deadline; it still waits behind A's reserve
    app.sweeper.sweep()
    assert drain(url, INVENTORY) == [], "A still holds the only place"
    fence = app.orchestrator.get(b.saga_id).steps["reserve_stock"]
    resent = scalar(
        app.engine,
        "SELECT count(*) FROM saga.saga_history WHERE saga_id = :s AND event = 'fence_resent'",
        s=b.saga_id,
    )
    assert (fence.compensation_attempt, resent) == (1, 0), (
        "a fence that never left for the broker spent an attempt"
    )


def test_a_saga_in_review_gets_no_command_released_and_the_limit_holds(settings, clock):
    """A saga handed to a person keeps its waiting rows ("a person may send it on"), but
    ``release`` picks waiting rows whatever their saga's status: the command of a saga in
    MANUAL_REVIEW goes out by itself, and since sent rows only count for active sagas, it
    does not count, so the next waiting command goes out too: two unanswered commands
    on a queue limited to one.

    A's reserve is sent, times out and is sent again (the copy waits behind B's); the
    first copy is dead-lettered and the step's policy puts A in MANUAL_REVIEW (replaying
    the dead letter is to resume it). B answers: A's waiting copy is released."""
    app = build_order_app(
        dataclasses.replace(settings, max_in_flight="inventory=1"),
        clock=clock,
        on_dead_letter="manual_review",
    )
    app.sweeper._backlog = dict
    url = settings.broker_url
    try:
        a = to_reserve(app, url, "fr-a")  # A's reserve: sent, left on the queue
        b = to_reserve(app, url, "fr-b")  # B's reserve waits
        clock.advance(31)
        app.sweeper.sweep()  # A's is sent again, in the room its first copy holds
        assert [r["saga_id"] for r in waiting_rows(app)] == [b.saga_id]
        reject_one(url, INVENTORY)  # A's first copy is dead-lettered
        app.intake.take(DEAD_LETTER)
        # A waits for a person: its room frees, and B's reserve goes out.
        assert app.orchestrator.get(a.saga_id).status is SagaStatus.MANUAL_REVIEW
        a_again, b_reserve = drain(url, INVENTORY)
        assert (a_again["headers"]["saga_id"], b_reserve["headers"]["saga_id"]) == (
            a.saga_id,
            b.saga_id,
        )
        run_command(app, b_reserve)
        (reply,) = drain(url, "saga.replies")
        run_reply(app, reply)  # B's answer frees the place
        c = to_reserve(app, url, "fr-c")
        out = [m["headers"]["saga_id"] for m in drain(url, INVENTORY)]
        assert app.orchestrator.get(a.saga_id).status is SagaStatus.MANUAL_REVIEW
        assert len(out) <= 1, f"limit 1, yet {len(out)} sent and unanswered: {out}"
        assert a.saga_id not in out, "a command of a saga in review went out on its own"
        assert out == [c.saga_id]
    finally:
        app.close()


def test_a_resend_does_not_let_another_command_past_the_limit(one_out, clock, settings):
    """``max_in_flight`` is "commands sent and not yet answered", yet a re-send frees the
    slot of the copy still out (``FlowControl.stage``: a step in ``resent`` is "answered")
    and puts the new copy at the back of the waiting line: the next saga's command goes
    out while the first copy is still on its worker. Under overload (a slow participant,
    so timeouts) every re-send lets one more command in: the participant ends up with
    the limit plus one per re-send, which is what flow control is there to prevent, and
    each re-sent copy reaches it later as duplicate work."""
    app, url = one_out, settings.broker_url
    a = to_reserve(app, url, "fs-a")
    (a_first,) = drain(url, INVENTORY)  # on its worker, slow: no answer yet
    b = to_reserve(app, url, "fs-b")  # waits
    clock.advance(31)
    app.sweeper.sweep()  # A's reserve had no answer in time: sent again
    assert app.orchestrator.get(a.saga_id).steps["reserve_stock"].attempt == 2
    out = [m["headers"]["saga_id"] for m in drain(url, INVENTORY)]
    assert b.saga_id not in out, (
        "B's reserve went out while A's first copy is still unanswered: 2 out, limit 1"
    )
    # Nor does A's re-send wait behind B for a place its own copy holds: were that copy
    # lost, the step would hold the place and wait for it forever (found in review of the
    # first fix: a sweep of 30 lost commands sent 2 of their re-sends).
    assert out == [a.saga_id]
    assert a_first["headers"]["saga_id"] == a.saga_id


@pytest.mark.xfail(
    strict=True,
    reason="known: a forward command still waiting when its saga turns to compensation is "
    "sent when room frees, then undone; withdrawing it needs the decider to know it never "
    "left (it only learns that at a deadline)",
)
def test_a_compensating_saga_sends_no_forward_command_that_was_still_waiting(
    one_out, clock, settings
):
    """Once a saga compensates, "nothing more is sent forward, but what is in flight may
    still answer" (``_await_once_more``). A forward command still waiting for capacity
    was never sent, yet ``begin_compensation`` leaves its step REQUESTED and its row
    waiting: when room frees, ``release`` sends it, the participant does the work (stock
    reserved for an order being cancelled), and only its answer lets the compensation go
    on. Under overload this feeds forward work to the very participant that is behind."""
    app, url = one_out, settings.broker_url
    to_reserve(app, url, "fc-a")
    (a_reserve,) = drain(url, INVENTORY)  # A's reserve holds the only place
    b = to_reserve(app, url, "fc-b")  # B's reserve waits
    state = app.orchestrator.get(b.saga_id)
    act(app, b.saga_id, "compensate", actor="ana", reason="customer cancelled",
        expect_version=state.version)  # fmt: skip
    assert app.orchestrator.get(b.saga_id).status is SagaStatus.COMPENSATING
    run_command(app, a_reserve)
    (reply,) = drain(url, "saga.replies")
    run_reply(app, reply)  # A's answer frees the place
    sent = [
        m["headers"]["task"] for m in drain(url, INVENTORY) if m["headers"]["saga_id"] == b.saga_id
    ]
    assert "inventory.reserve" not in sent, (
        "B's forward command, never sent before B began compensating, was sent after"
    )


def test_a_queue_whose_limit_is_lifted_still_sends_what_waited(settings, clock):
    """Commands waiting when a queue's limit is lifted (a redeploy with
    SAGA_MAX_IN_FLIGHT=inventory=1 -> orders=5: every queue not named has no limit) are
    never released: ``release`` only looks at queues with a limit, yet the sweeper still
    reads the rows (flow control is on for orders) and calls each deadline
    "dispatch_waiting" forever. The saga is stuck with nothing sent."""
    url = settings.broker_url
    first = build_order_app(dataclasses.replace(settings, max_in_flight="inventory=1"), clock=clock)
    try:
        to_reserve(first, url, "fl-a")
        b = to_reserve(first, url, "fl-b")  # waits behind A's reserve
        assert len(drain(url, INVENTORY)) == 1
    finally:
        first.close()
    app = build_order_app(dataclasses.replace(settings, max_in_flight="orders=5"), clock=clock)
    app.sweeper._backlog = dict
    try:
        sent = []
        for _ in range(4):  # four step timeouts
            clock.advance(31)
            app.sweeper.sweep()
            sent += [m for m in drain(url, INVENTORY) if m["headers"]["saga_id"] == b.saga_id]
        assert sent, "B's reserve was never sent: it waits for a limit that no longer exists"
    finally:
        app.close()


def test_a_release_with_an_earlier_clock_does_not_hand_out_time_twice(settings, clock):
    """The rate bucket stores ``at = :now`` whatever it held. ``FlowControl.release``
    reads the clock before it waits for the queue's lock, so under contention (or with
    two processes' clocks a little apart) a release can come in with a ``now`` earlier
    than the bucket's ``at``: it gets no tokens (``greatest(now - at, 0)``) but moves
    ``at`` back, and the next release is credited that time a second time. Here a
    bucket of one command per second sends three commands in 1.5 s."""
    from saga_tasks.persistence import dispatch

    app = build_order_app(dataclasses.replace(settings, rate_limit="orders=1"), clock=clock)
    url = settings.broker_url
    try:
        for i in range(4):
            app.start_saga("order", f"fk-{i}", ORDER)
        assert len(drain(url, "orders.commands")) == 1  # t0: the bucket's one token
        limits = {"orders.commands": dispatch.QueueLimit(rate_limit=1.0)}
        t0 = clock.now()

        def release_at(seconds):
            with app.engine.begin() as conn:
                return len(dispatch.release(conn, limits, t0 + timedelta(seconds=seconds)))

        assert release_at(1.0) == 1  # one more second, one more command
        assert release_at(0.5) == 0  # read its clock earlier, got the lock later
        assert release_at(1.5) == 0, "half a second after the last, a token was handed out"
    finally:
        app.close()


def in_flight(app, queue):
    return scalar(
        app.engine,
        "SELECT count(*) FROM saga.saga_dispatch WHERE queue = :q AND sent_at IS NOT NULL "
        "AND NOT paused",
        q=queue,
    )


def test_a_replayed_compensation_holds_its_place_at_the_queue(one_out, settings):
    """``saga-tasks held replay`` publishes the stored message straight to its queue, not
    through the outbox: a dead compensation replayed is awaited again (the saga resumes
    compensating), yet its step had given its place back when the compensation died, and
    the replay took none. The participant then had the replay and the next saga's reserve
    out at once on a queue limited to one, and the count said nothing was in flight."""
    app, url = one_out, settings.broker_url
    a = to_reserve(app, url, "fy-a")
    reject_one(url, INVENTORY)  # A's reserve dies: given up, its compensation goes out
    app.intake.take(DEAD_LETTER)
    reject_one(url, INVENTORY)  # the compensation dies too: a person must look
    app.intake.take(DEAD_LETTER)
    assert app.orchestrator.get(a.saga_id).status is SagaStatus.MANUAL_REVIEW
    (dead,) = [h for h in held(app) if h["task_name"] == "inventory.release"]
    app.replayer.replay(dead["id"], actor="ana", reason="inventory fixed")
    assert app.orchestrator.get(a.saga_id).status is SagaStatus.COMPENSATING
    assert in_flight(app, INVENTORY) == 1, "the replayed compensation is not counted"

    b = to_reserve(app, url, "fy-b")
    (replayed,) = drain(url, INVENTORY)
    assert replayed["headers"]["saga_id"] == a.saga_id, "B's reserve went past the limit"
    assert [r["step"] for r in waiting_rows(app, b.saga_id)] == ["reserve_stock"]
    run_command(app, replayed)
    (reply,) = drain(url, "saga.replies")
    run_reply(app, reply)  # the compensation answers: its place goes to B's reserve
    assert app.orchestrator.get(a.saga_id).steps["reserve_stock"].status is StepStatus.COMPENSATED
    (released,) = drain(url, INVENTORY)
    assert released["headers"]["saga_id"] == b.saga_id
    assert in_flight(app, INVENTORY) == 1


def test_a_replay_withdraws_its_steps_copy_waiting_for_capacity(settings, clock):
    """Found by the flow world: a step whose re-send waits for capacity, and whose first
    copy (sent by a deployment without a limit, so holding no place) died and is
    replayed. The replay takes the step's place and the waiting copy stayed: released
    when room freed, the step held two places and the participant got the command
    twice. The replay is the command the step awaits; the copy waiting is withdrawn."""
    url = settings.broker_url

    def deployment(limit: str):
        app = build_order_app(
            dataclasses.replace(settings, max_in_flight=limit),
            clock=clock,
            on_dead_letter="manual_review",
        )
        app.sweeper._backlog = dict
        return app

    unlimited = deployment("0")
    try:
        a = to_reserve(unlimited, url, "fw-a")  # A's reserve out, holding no place
    finally:
        unlimited.close()
    app = deployment("inventory=1")
    try:
        b = to_reserve(app, url, "fw-b")  # B's reserve takes the only place
        clock.advance(31)
        app.sweeper.sweep()  # A's re-send waits behind B; B's goes out in its own place
        assert [r["step"] for r in waiting_rows(app, a.saga_id)] == ["reserve_stock"]
        reject_one(url, INVENTORY)  # A's first copy dies
        app.intake.take(DEAD_LETTER)
        assert app.orchestrator.get(a.saga_id).status is SagaStatus.MANUAL_REVIEW
        (dead,) = [h for h in held(app) if str(h["saga_id"]) == a.saga_id]
        app.replayer.replay(dead["id"], actor="ana", reason="inventory fixed")
        assert app.orchestrator.get(a.saga_id).status is SagaStatus.RUNNING
        assert waiting_rows(app, a.saga_id) == [], "the replayed step's copy still waits"
        sent = scalar(
            app.engine,
            "SELECT count(*) FROM saga.saga_dispatch WHERE saga_id = :s AND sent_at IS NOT NULL",
            s=a.saga_id,
        )
        assert sent == 1
        for message in drain(url, INVENTORY):  # B's copies and A's replay answer
            run_command(app, message)
        for reply in drain(url, "saga.replies"):
            run_reply(app, reply)
        assert [m["headers"]["saga_id"] for m in drain(url, INVENTORY)] == [], (
            f"a copy of A's replayed command went out when B's answer ({b.saga_id}) freed room"
        )
    finally:
        app.close()
