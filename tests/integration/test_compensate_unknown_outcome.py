"""An operator's compensate while the order's confirm (a step that cannot be undone) was
given up: what the confirmed order builds on must stay."""

from __future__ import annotations

from saga_tasks.core.model import LATE_SUCCESS
from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused
from saga_tasks.ops.operator import act
from saga_tasks.runtime.holding import DEAD_LETTER
from tests.helpers import ORDER, drain, pump, reject_the_last, run_command, run_reply, scalar


def to_confirm_given_up(app, clock, url, key):
    """Create, reserve and authorize answered; the confirm waits in the orders queue (the
    service is slow), the sweeper sends it again, and that copy is dead-lettered: the
    confirm is given up, its outcome unknown, and the saga is in review. (Silence alone
    no longer gives up a step that cannot be undone: it is sent until it answers.)"""
    # The sweeper cannot read the queue's depth (as when the broker does not answer it):
    # a confirm queued behind the first copy would otherwise wait on instead of a re-send.
    app.sweeper._backlog = dict
    handle = app.start_saga("order", key, ORDER)
    for queue in ("orders.commands", "inventory.commands", "payments.commands"):
        (command,) = drain(url, queue)
        run_command(app, command)
        (reply,) = drain(url, "saga.replies")
        run_reply(app, reply)
    deadline = app.orchestrator.get(handle.saga_id).steps["confirm_order"].deadline
    clock.advance((deadline - clock.now()).total_seconds() + 1)
    assert app.sweeper.sweep().commands == 1
    reject_the_last(url, "orders.commands")  # the re-send dies; the first copy waits
    app.intake.take(DEAD_LETTER)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.MANUAL_REVIEW, state.reason
    assert state.steps["confirm_order"].status is StepStatus.TIMED_OUT
    return handle


def compensate(app, saga_id):
    """An operator's compensate; refused is an answer too."""
    try:
        act(
            app,
            saga_id,
            "compensate",
            actor="ana",
            reason="undo the order",
            expect_version=app.orchestrator.get(saga_id).version,
        )
    except ActionRefused as refused:
        assert "cannot be undone" in str(refused)
        return False
    return True


def effects(app, saga_id):
    found = {}
    for name, sql in (
        ("order", "SELECT status FROM orders.orders WHERE saga_id = :s"),
        ("payment", "SELECT status FROM payments.authorization WHERE saga_id = :s"),
        ("stock", "SELECT status FROM inventory.reservation WHERE saga_id = :s"),
    ):
        owner = {"order": "orders", "payment": "payments", "stock": "inventory"}[name]
        found[name] = scalar(app.participant_engine(owner), sql, s=saga_id)
    return found


def test_compensate_is_refused_once_a_step_that_cannot_be_undone_succeeded_late(
    clocked_app, clock, settings
):
    app, url = clocked_app, settings.broker_url
    handle = to_confirm_given_up(app, clock, url, "late-confirm")
    pump(app, url)  # the orders service is back: the confirm runs, its success comes late
    state = app.orchestrator.get(handle.saga_id)
    assert state.steps["confirm_order"].error == LATE_SUCCESS
    assert state.status is SagaStatus.MANUAL_REVIEW

    accepted = compensate(app, handle.saga_id)
    pump(app, url)
    assert effects(app, handle.saga_id) == {
        "order": "CONFIRMED",
        "payment": "AUTHORIZED",
        "stock": "RESERVED",
    }
    assert not accepted


def test_compensate_leaves_no_confirmed_order_without_its_payment(clocked_app, clock, settings):
    """Found by review: compensate was accepted while the confirm (no compensation) was
    given up with its command still queued; nothing fences such a command, so it then
    confirmed the order after its payment was voided. Refused now: retry it (its outcome
    becomes known) or resolve by hand."""
    app, url = clocked_app, settings.broker_url
    handle = to_confirm_given_up(app, clock, url, "unknown-confirm")
    compensate(app, handle.saga_id)
    pump(app, url)  # the orders service is back: its queue runs in order, the confirm first
    found = effects(app, handle.saga_id)
    assert found["order"] == "CONFIRMED"
    assert (found["payment"], found["stock"]) == ("AUTHORIZED", "RESERVED"), (
        f"{found}; saga {app.orchestrator.get(handle.saga_id).status}"
    )
