"""The timeout sweeper over real PostgreSQL and RabbitMQ, with a clock the test moves."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from saga_tasks.core.states import SagaStatus, StepStatus
from tests.helpers import (
    ORDER,
    build_order_app,
    drain,
    lapse,
    pump,
    rows,
    run_command,
    run_reply,
    scalar,
)


def create_and_advance_to_reserve(app, broker_url, key):
    handle = app.start_saga("order", key, ORDER)
    (create,) = drain(broker_url, "orders.commands")
    run_command(app, create)
    (reply,) = drain(broker_url, "saga.replies")
    run_reply(app, reply)
    return handle


def events(app, saga_id):
    return [
        r["event"]
        for r in rows(
            app.engine,
            "SELECT event FROM saga.saga_history WHERE saga_id = :s ORDER BY id",
            s=saga_id,
        )
    ]


def test_no_answer_resends_then_gives_up_and_the_late_command_meets_a_tombstone(
    clocked_app, clock, settings
):
    app, url = clocked_app, settings.broker_url
    handle = create_and_advance_to_reserve(app, url, "t-1")
    (lost,) = drain(url, "inventory.commands")  # never answered
    for attempt in (2, 3):
        lapse(app, clock, handle.saga_id)
        report = app.sweeper.sweep()
        assert (report.claimed, report.changed, report.commands) == (1, 1, 1)
        (again,) = drain(url, "inventory.commands")
        assert again["headers"]["saga_command_id"] == lost["headers"]["saga_command_id"]
        assert again["headers"]["id"] != lost["headers"]["id"]
        assert again["headers"]["saga_attempt"] == attempt
    lapse(app, clock, handle.saga_id)
    app.sweeper.sweep()
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATING
    assert state.steps["reserve_stock"].given_up
    (release,) = drain(url, "inventory.commands")
    assert release["headers"]["task"] == "inventory.release"
    assert release["headers"]["saga_compensates"] == lost["headers"]["saga_command_id"]
    # The compensation runs first and leaves a tombstone; the lost command then arrives.
    run_command(app, release)
    assert run_command(app, lost) == "duplicate"
    pump(app, url)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATED
    assert scalar(app.engine, "SELECT count(*) FROM inventory.reservation") == 0
    assert scalar(app.engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 0
    assert scalar(app.engine, "SELECT status FROM orders.orders") == "CANCELLED"
    history = events(app, handle.saga_id)
    assert history.count("step_resent") == 2
    assert "step_given_up" in history and "late_reply" in history
    assert history[-1] == "saga_compensated"


def test_a_quiet_sweep_touches_nothing(clocked_app, clock, settings):
    handle = create_and_advance_to_reserve(clocked_app, settings.broker_url, "t-2")
    version = clocked_app.orchestrator.get(handle.saga_id).version
    clock.advance(5)
    assert clocked_app.sweeper.sweep().claimed == 0
    assert clocked_app.orchestrator.get(handle.saga_id).version == version


@pytest.fixture
def unlimited_app(settings, clock):
    """The order saga with a clock the test moves and no flow control: every command
    goes out at once."""
    app = build_order_app(dataclasses.replace(settings, max_in_flight="0"), clock=clock)
    yield app
    app.close()


def test_two_sweepers_never_act_twice_on_one_saga(unlimited_app, clock, settings):
    app, url = unlimited_app, settings.broker_url
    # Nor backlogs: one sweeper's re-sends would otherwise be a backlog the other sees in
    # orders.commands, and its sagas would wait on instead.
    app.sweeper._backlog = dict
    sagas = 60
    for i in range(sagas):
        app.start_saga("order", f"t-s{i}", ORDER)
    drain(url, "orders.commands")
    clock.advance(31)
    reports = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        barrier.wait()
        reports.append(app.sweeper.sweep(batch=7))

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.claimed for r in reports) == sagas
    assert sum(r.changed for r in reports) == sagas
    assert all(r.claimed for r in reports), "both sweepers took part"
    assert (
        scalar(
            app.engine,
            "SELECT count(*) FROM saga.saga_step WHERE step = 'create_order' AND attempt = 2",
        )
        == sagas
    )
    assert (
        scalar(app.engine, "SELECT count(*) FROM saga.saga_history WHERE event = 'step_resent'")
        == sagas
    )
    assert len(drain(url, "orders.commands", limit=1000)) == sagas


def test_a_timeout_racing_a_success_makes_one_transition(clocked_app, clock, settings):
    app, url = clocked_app, settings.broker_url
    sagas = 30
    handles = [app.start_saga("order", f"t-r{i}", ORDER) for i in range(sagas)]
    for command in drain(url, "orders.commands", limit=1000):
        run_command(app, command)
    replies = drain(url, "saga.replies", limit=1000)
    clock.advance(31)  # every create_order is due, and its success is on the way
    done = threading.Event()

    def deliver() -> None:
        for reply in replies:
            run_reply(app, reply)
        done.set()

    def sweep() -> None:
        while not done.is_set():
            app.sweeper.sweep(batch=3)

    threads = [threading.Thread(target=deliver), threading.Thread(target=sweep)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for handle in handles:
        state = app.orchestrator.get(handle.saga_id)
        assert state.steps["create_order"].status is StepStatus.SUCCEEDED
        assert state.steps["reserve_stock"].status is StepStatus.REQUESTED
        assert state.steps["reserve_stock"].attempt == 1
        assert events(app, handle.saga_id).count("step_succeeded") == 1
    # The next step was sent once per saga, whichever of the two came first.
    assert len(drain(url, "inventory.commands", limit=1000)) == sagas


def test_the_saga_deadline_compensates_what_succeeded(clocked_app, clock, settings):
    app, url = clocked_app, settings.broker_url
    handle = create_and_advance_to_reserve(app, url, "t-d")
    (reserve,) = drain(url, "inventory.commands")
    run_command(app, reserve)
    run_reply(app, drain(url, "saga.replies")[0])
    drain(url, "payments.commands")  # authorize never answers
    clock.advance(601)
    app.sweeper.sweep()
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATING
    assert state.reason == "the saga's deadline passed"
    pump(app, url)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.COMPENSATED
    assert [s.status for s in state.steps.values()] == [
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATED,
        StepStatus.SKIPPED,
    ]
    assert scalar(app.engine, "SELECT count(*) FROM payments.authorization") == 0


def test_a_wake_up_time_that_disagrees_with_the_saga_is_repaired_once(clocked_app, clock, settings):
    app = clocked_app
    handle = create_and_advance_to_reserve(app, settings.broker_url, "t-stale")
    before = app.orchestrator.get(handle.saga_id)
    version = before.version
    with app.engine.begin() as conn:  # as a manual edit or a restored backup might leave it
        conn.exec_driver_sql(
            "UPDATE saga.saga_instance SET next_wake_at = now() - interval '1 hour'"
        )
    report = app.sweeper.sweep()
    assert (report.claimed, report.changed, report.commands) == (1, 0, 0)
    assert app.sweeper.sweep().claimed == 0, "repaired: not claimed again"
    wake = scalar(app.engine, "SELECT next_wake_at FROM saga.saga_instance")
    assert wake == app.orchestrator.get(handle.saga_id).steps["reserve_stock"].deadline
    after = app.orchestrator.get(handle.saga_id)
    assert after.version == version
    # A repair is not progress: the saga's last change is still its last change.
    assert after.extra["updated_at"] == before.extra["updated_at"]
    assert drain(settings.broker_url, "inventory.commands")[0]["headers"]["saga_attempt"] == 1


def test_many_due_sagas_are_swept_in_batches(clocked_app, clock, settings):
    app = clocked_app
    handles = [app.start_saga("order", f"t-many-{i}", ORDER) for i in range(30)]
    drain(settings.broker_url, "orders.commands", limit=100)
    clock.advance(31)
    report = app.sweeper.sweep(batch=7)
    assert (report.claimed, report.changed, report.commands) == (30, 30, 30)
    resent = drain(settings.broker_url, "orders.commands", limit=100)
    assert sorted(m["headers"]["saga_id"] for m in resent) == sorted(h.saga_id for h in handles)
    assert {m["headers"]["saga_attempt"] for m in resent} == {2}
    assert app.sweeper.sweep().claimed == 0


def test_sagas_that_cannot_be_decided_never_starve_the_others(clocked_app, clock, settings):
    """Compensating sagas past their own deadline, and a saga of a version this process
    does not load, sort first by wake-up time: with a batch of their size they used to
    fill every batch of every pass, and no other saga's timeout fired."""
    app, url = clocked_app, settings.broker_url
    stuck = [app.start_saga("order", f"t-old-{i}", ORDER) for i in range(3)]
    drain(url, "orders.commands", limit=10)
    with app.engine.begin() as conn:
        # Two compensating past their deadline (their compensation still has time),
        # one of a version nobody loads: all due an hour ago.
        conn.exec_driver_sql(
            "UPDATE saga.saga_step SET status = 'COMPENSATING', "
            "compensation_id = gen_random_uuid(), deadline = now() + interval '1 hour'"
        )
        conn.exec_driver_sql(
            "UPDATE saga.saga_instance SET status = 'COMPENSATING', "
            "deadline = now() - interval '1 hour', next_wake_at = now() - interval '1 hour'"
        )
        conn.exec_driver_sql(
            "UPDATE saga.saga_instance SET definition_version = 99 WHERE saga_id = %s",
            (stuck[2].saga_id,),
        )
    waiting = app.start_saga("order", "t-waiting", ORDER)
    drain(url, "orders.commands", limit=10)
    clock.advance(31)  # the waiting saga's create_order is due
    for _ in range(2):  # two passes, each of one batch of three
        app.sweeper.sweep(batch=3, max_batches=1)
    (resent,) = drain(url, "orders.commands", limit=10)
    assert resent["headers"]["saga_id"] == waiting.saga_id
    assert app.orchestrator.get(waiting.saga_id).steps["create_order"].attempt == 2
    unknown = app.orchestrator.get(stuck[2].saga_id)
    assert unknown.status is SagaStatus.MANUAL_REVIEW
    assert "version 99" in (unknown.reason or "")
    for h in stuck[:2]:
        state = app.orchestrator.get(h.saga_id)
        assert state.status is SagaStatus.COMPENSATING
        assert state.next_wake_at() > clock.now(), "due for nothing: not claimed again"
    assert app.sweeper.sweep().claimed == 0


def test_a_command_queued_behind_a_backlog_is_not_sent_again(clocked_app, clock, settings):
    """The reserve command waits in a backed-up queue (nobody consumes it yet): at its
    deadline the sweeper sees the queue's depth and sends no copy (it would double the
    queue's work); once the queue is empty, the silence is the participant's and the
    command is sent again."""
    from saga_tasks.testing import queue_depths

    app, url = clocked_app, settings.broker_url
    handle = create_and_advance_to_reserve(app, url, "backlog-1")
    assert queue_depths(url, ["inventory.commands"]) == {"inventory.commands": 1}
    clock.advance(31)
    report = app.sweeper.sweep()
    assert (report.claimed, report.changed, report.commands) == (1, 1, 0)
    assert queue_depths(url, ["inventory.commands"]) == {"inventory.commands": 1}
    state = app.orchestrator.get(handle.saga_id)
    assert state.steps["reserve_stock"].attempt == 1
    assert events(app, handle.saga_id)[-1] == "resend_deferred"
    (waiting,) = drain(url, "inventory.commands")  # lost on the way, say
    clock.advance(31)
    assert app.sweeper.sweep().commands == 1
    (resent,) = drain(url, "inventory.commands")
    assert resent["headers"]["saga_command_id"] == waiting["headers"]["saga_command_id"]
    assert app.orchestrator.get(handle.saga_id).steps["reserve_stock"].attempt == 2


def test_a_step_that_cannot_be_undone_is_sent_until_it_answers_with_one_alert(
    clocked_app, clock, settings, caplog
):
    """Forward recovery through the real sweeper: confirm_order (no compensation) never
    answers; it is sent again past its three attempts, the saga stays RUNNING, and one
    ALERT line names the step once its attempts are spent."""
    app, url = clocked_app, settings.broker_url
    app.sweeper._backlog = dict  # the copies pile up in orders.commands: no backlog check
    handle = app.start_saga("order", "t-overdue", ORDER)
    for queue in ("orders.commands", "inventory.commands", "payments.commands"):
        (command,) = drain(url, queue)
        run_command(app, command)
        (reply,) = drain(url, "saga.replies")
        run_reply(app, reply)
    caplog.set_level("ERROR", logger="saga_tasks.orchestrator")
    # The saga's own deadline passes with the first silence: five re-sends' waits, less their
    # jitter (up to a quarter each, drawn from the saga's random id), can add up to less than
    # the saga's 600 s, so waiting for it "on the way" failed now and then.
    deadline = app.orchestrator.get(handle.saga_id).deadline
    clock.advance((deadline - clock.now()).total_seconds() + 1)
    for _ in range(8):  # five re-sends
        if app.orchestrator.get(handle.saga_id).steps["confirm_order"].attempt == 6:
            break
        lapse(app, clock, handle.saga_id)
        app.sweeper.sweep()
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.RUNNING, state.reason
    assert state.steps["confirm_order"].attempt == 6
    assert "deadline_passed_forward" in events(app, handle.saga_id)
    alerts = [r for r in caplog.records if r.getMessage().startswith("ALERT step confirm_order")]
    assert len(alerts) == 1 and alerts[0].saga_id == handle.saga_id
    copies = drain(url, "orders.commands")
    assert len(copies) == 6 and len({c["headers"]["saga_command_id"] for c in copies}) == 1
    run_command(app, copies[-1])
    pump(app, url)
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED
