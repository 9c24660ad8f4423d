"""Replaying what the saga still waits for.

Two held messages the saga awaits are called "late: the step has moved on" by
``holding.replay_checks``, which blocks their replay unless forced: the dead command of a
step given up (the decider's ``given_up_command`` branch re-awaits it on replay), and the
fence of a step done by hand (the step is SUCCEEDED and fencing, its compensation id None).
"""

from __future__ import annotations

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.ops.operator import act
from saga_tasks.ops.views import held_list, held_show
from saga_tasks.runtime.holding import DEAD_LETTER
from tests.helpers import ORDER, drain, pump, reject_one, reject_the_last, run_command, run_reply


def to_confirm(app, url, key):
    """Run the order saga up to its last step, whose command is left on its queue."""
    handle = app.start_saga("order", key, ORDER)
    for queue in ("orders.commands", "inventory.commands", "payments.commands"):
        run_command(app, drain(url, queue)[0])
        run_reply(app, drain(url, "saga.replies")[0])
    return handle


def test_the_dead_command_of_a_step_that_cannot_be_undone_can_be_replayed(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = to_confirm(app, url, "rv-1")
    reject_one(url, "orders.commands")  # confirm_order: no compensation
    app.intake.take(DEAD_LETTER)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.MANUAL_REVIEW, state.reason
    assert state.steps["confirm_order"].status is StepStatus.TIMED_OUT
    (held,) = held_list(app, DEAD_LETTER)["messages"]
    blocking = [c for c in held_show(app, held["id"])["replay_checks"] if c["blocks"]]
    assert not blocking, blocking
    app.replayer.replay(
        held["id"], actor="ana", reason="orders fixed", expect_version=state.version
    )
    pump(app, url)
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED


def test_a_dead_fence_is_awaited_and_can_be_replayed(order_app, settings):
    app, url = order_app, settings.broker_url
    handle = app.start_saga("order", "rv-2", ORDER)
    run_command(app, drain(url, "orders.commands")[0])
    run_reply(app, drain(url, "saga.replies")[0])  # reserve_stock's command is queued
    state = app.orchestrator.get(handle.saga_id)
    act(app, handle.saga_id, "skip_step", step="reserve_stock", actor="ana",
        reason="reserved by hand", expect_version=state.version)  # fmt: skip
    assert app.flush()
    reject_the_last(url, "inventory.commands")  # the fence (inventory.release) dies
    app.intake.take(DEAD_LETTER)
    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.MANUAL_REVIEW, "a dead fence needs a person"
    assert "fence" in (state.reason or "")
    (held,) = held_list(app, DEAD_LETTER)["messages"]
    assert held["task_name"] == "inventory.release"
    blocking = [c for c in held_show(app, held["id"])["replay_checks"] if c["blocks"]]
    assert not blocking, blocking
    app.replayer.replay(
        held["id"], actor="ana", reason="the fence again", expect_version=state.version
    )
    pump(app, url)
    state = app.orchestrator.get(handle.saga_id)
    assert not state.steps["reserve_stock"].fencing
    assert state.steps["reserve_stock"].error is None, "the replayed fence answered"
