"""The task gate (``core.gate``): what a saga queue runs and what no message may ask."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from saga_tasks.core.gate import EMBEDDED, TaskGate

GATE = TaskGate(
    {
        "saga.replies": frozenset({"saga_tasks.reply"}),
        "saga.maintenance": frozenset({"saga_tasks.sweep_timeouts"}),
        "inventory.commands": frozenset({"inventory.reserve", "inventory.release"}),
        "payments.commands": frozenset(),
    }
)
PLAIN = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
OURS = [(q, t) for q, names in GATE.tasks.items() for t in names]
QUEUES = sorted(GATE.tasks)
CELERY = ["celery.accumulate", "celery.chord_unlock", "celery.map", "celery.backend_cleanup"]


def headers(task: str, **more: Any) -> dict[str, Any]:
    return {"task": task, "id": "m-1", "timelimit": [None, None], "ignore_result": True, **more}


def test_our_own_messages_pass():
    for queue, task in OURS:
        assert GATE.refusal(queue, headers(task), [[], {"a": 1}, PLAIN]) is None
        assert GATE.refusal(queue, headers(task, group=None, eta=None), [[], {}, None]) is None


@given(
    st.sampled_from(QUEUES),
    st.sampled_from([*CELERY, *(t for _, t in OURS), "someone.else"]),
)
def test_a_queue_runs_only_its_own_tasks(queue, task):
    refused = GATE.refusal(queue, headers(task), [[], {}, PLAIN])
    assert (refused is None) == (task in GATE.tasks[queue])
    if refused is not None:
        assert f"task {task!r} does not run on {queue}" in refused
        home = GATE.home(task)
        assert (f"it runs on {home}" in refused) == (home is not None)


@given(
    st.sampled_from(OURS),
    st.sets(st.sampled_from(EMBEDDED), min_size=1),
    st.one_of(st.lists(st.just({"task": "x"}), min_size=1, max_size=2), st.just({"task": "x"})),
)
def test_no_follow_up_work_is_ever_run(home, asked, value):
    queue, task = home
    embed = {**PLAIN, **dict.fromkeys(asked, value)}
    refused = GATE.refusal(queue, headers(task), [[], {}, embed])
    assert refused is not None and "asks for follow-up work" in refused
    assert all(k in refused for k in asked)


def test_group_eta_timelimit_and_stored_results_are_refused():
    task, queue = "saga_tasks.reply", "saga.replies"
    body = [[], {}, PLAIN]
    for extra, said in (
        ({"group": "g-1"}, "follow-up work (group)"),
        ({"eta": "2030-01-01T00:00:00"}, "eta"),
        ({"countdown": 5}, "eta"),
        ({"timelimit": [0.001, None]}, "time limit"),
        ({"timelimit": [None, 1]}, "time limit"),
        ({"ignore_result": False}, "result to be stored"),
    ):
        refused = GATE.refusal(queue, headers(task, **extra), body)
        assert refused is not None and said in refused, extra


def test_protocol_one_and_odd_bodies_are_refused_on_saga_queues():
    v1 = {"task": "saga_tasks.reply", "id": "m", "args": [], "kwargs": {}, "callbacks": []}
    assert "protocol 1" in (GATE.refusal("saga.replies", {}, v1) or "")
    # Naming no task at all it is no task message: Celery's path records it as such.
    assert GATE.refusal("saga.replies", None, b"junk") is None
    assert GATE.refusal("saga.replies", {}, {"a": 1}) is None
    for body in ({"a": 1}, [[], {}], [{}, {}, None], [[], [], None], [[], {}, "x"]):
        assert "protocol 2" in (
            GATE.refusal("saga.replies", headers("saga_tasks.reply"), body) or ""
        )


def test_another_apps_queue_is_not_judged_but_our_tasks_are_refused_there():
    body = [[], {}, {**PLAIN, "chain": [{"task": "x"}]}]
    assert GATE.refusal("reports", headers("celery.chord_unlock"), body) is None
    assert GATE.refusal("reports", {}, {"task": "reports.build"}) is None
    refused = GATE.refusal("reports", headers("inventory.reserve"), [[], {}, PLAIN])
    assert refused == "task 'inventory.reserve' runs on inventory.commands only, not on reports"
    unknown = GATE.refusal(None, headers("saga_tasks.reply"), [[], {}, PLAIN])
    assert unknown is not None and "a queue of unknown name" in unknown
    assert "protocol 1" in (GATE.refusal("reports", {}, {"task": "saga_tasks.reply"}) or "")
