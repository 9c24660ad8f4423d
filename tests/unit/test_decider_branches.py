"""Branches, pivots and human steps in the decider, over random definitions and runs.

Conditions: a step not taken is never sent, never awaited, never compensated, and the
steps taken are exactly those an independent reading of the definition says. Pivots:
once the pivot succeeded nothing is compensated, whatever answers or silence follow.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga_tasks import Condition, at_least, equals, exists, human_step, less, not_equals, one_of
from saga_tasks.core.conditions import read
from saga_tasks.core.definitions import SagaDefinition, saga, step
from saga_tasks.core.states import (
    IN_FLIGHT,
    Classification,
    MessageKind,
    Outcome,
    SagaStatus,
    StepStatus,
)
from saga_tasks.errors import ActionRefused, DefinitionError, InvalidPayload
from saga_tasks.testing import SignalReceived
from tests.unit.sagas import Driver, check

VALUES = st.sampled_from(["a", "b", 1, 2, None])
SAGA_ID = "0b7e4c1e-5d0c-4b57-9a43-2a3a8f1f0c11"
"""One saga id for every example: ids, and so the jitter of waits, derive from it, and a
test whose draws depend on which deadlines fall together must see the same ones again."""


def _condition(draw: st.DrawFn, readable: list[str]) -> Condition | None:
    if not draw(st.booleans()):
        return None
    path = draw(st.sampled_from(["payload.v", *[f"{r}.v" for r in readable]]))
    kind = draw(st.sampled_from(["eq", "in", "exists", "ge"]))
    c: Condition
    if kind == "eq":
        c = equals(path, draw(VALUES))
    elif kind == "in":
        c = one_of(path, draw(st.lists(VALUES, max_size=3)))
    elif kind == "exists":
        c = exists(path)
    else:
        c = at_least(path, 1)
    return ~c if draw(st.booleans()) else c


@st.composite
def branching(draw: st.DrawFn) -> SagaDefinition:
    n = draw(st.integers(min_value=1, max_value=6))
    steps: list[Any] = []
    ancestors: dict[str, set[str]] = {}
    for i in range(n):
        parents = (
            sorted(draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=2)))
            if i
            else []
        )
        names = [f"s{p}" for p in parents]
        ancestors[f"s{i}"] = set(names).union(*(ancestors[p] for p in names))
        steps.append(
            step(
                f"s{i}",
                f"p.do{i}",
                compensation=f"p.undo{i}" if draw(st.booleans()) else None,
                queue="q.commands",
                depends_on=names,
                when=_condition(draw, sorted(ancestors[f"s{i}"])),
            )
        )
    return saga("branching", *steps)


def _expected_taken(defn: SagaDefinition, payload: dict[str, Any], results: dict[str, Any]):
    """An independent reading: a root runs when its condition holds; any other step when
    one of its parents ran and its condition holds over the results of steps that ran."""
    taken: set[str] = set()
    for s in defn.steps:
        parents = defn.parents[s.name]
        if parents and not any(p in taken for p in parents):
            continue
        seen = {n: results[n] for n in taken}
        if s.when is None or s.when.holds(payload, seen):
            taken.add(s.name)
    return taken


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(defn=branching(), data=st.data())
def test_steps_not_taken_are_never_sent_awaited_nor_compensated(
    defn: SagaDefinition, data: st.DataObject
) -> None:
    payload = {"v": data.draw(VALUES)}
    results = {s.name: {"v": data.draw(VALUES)} for s in defn.steps}
    d = Driver(defn, saga_id=SAGA_ID, payload=payload)
    before = d.state
    check(defn, before, d.start())
    fail_at = data.draw(st.sampled_from([None, *defn.by_name]))
    for _ in range(3 * len(defn.steps) + 2):
        awaited = [n for n, x in d.state.steps.items() if x.status in IN_FLIGHT]
        if not awaited:
            break
        name = awaited[0]
        before = d.state
        x = d.state.steps[name]
        if x.status is StepStatus.COMPENSATING:
            event = d.reply(name, kind=MessageKind.COMPENSATION)
        elif name == fail_at:
            event = d.reply(name, Outcome.FAILURE)
        else:
            event = d.reply(name, result=results[name])
        check(defn, before, d.apply(event))
    not_taken = {n for n, x in d.state.steps.items() if x.not_taken}
    sent = {(c.step, c.kind) for dec in d.decisions for c in dec.commands}
    for name in not_taken:
        assert (name, MessageKind.COMMAND) not in sent
        assert (name, MessageKind.COMPENSATION) not in sent
    assert d.state.status in (SagaStatus.COMPLETED, SagaStatus.COMPENSATED), d.state.reason
    if fail_at is None:
        assert d.state.status is SagaStatus.COMPLETED
        taken = {n for n, x in d.state.steps.items() if x.status is StepStatus.SUCCEEDED}
        assert taken == _expected_taken(defn, payload, results)
        assert taken | not_taken == set(defn.by_name), "every step is taken or not"


def test_a_branch_joins_on_the_steps_taken_and_the_history_says_why() -> None:
    defn = saga(
        "return",
        step("receive", "w.receive", queue="w.commands"),
        step(
            "refund",
            "p.refund",
            compensation="p.void",
            queue="p.commands",
            when=equals("receive.ok", True),
        ),
        step(
            "send_back",
            "w.send_back",
            queue="w.commands",
            depends_on=["receive"],
            when=~equals("receive.ok", True),
        ),
        step("notify", "n.notify", queue="n.commands", depends_on=["refund", "send_back"]),
    )
    d = Driver(defn)
    d.start()
    d.apply(d.reply("receive", result={"ok": False}))
    assert d.state.steps["refund"].not_taken
    assert d.state.steps["send_back"].status is StepStatus.REQUESTED
    entries = {(h.event, h.step) for h in d.decisions[-1].history}
    assert ("step_not_taken", "refund") in entries and ("condition_held", "send_back") in entries
    d.succeed("send_back")
    assert d.state.steps["notify"].status is StepStatus.REQUESTED
    d.succeed("notify")
    assert d.state.status is SagaStatus.COMPLETED


@st.composite
def pivoted(draw: st.DrawFn) -> SagaDefinition:
    before = draw(st.integers(min_value=0, max_value=3))
    after = draw(st.integers(min_value=1, max_value=3))
    steps = []
    for i in range(before):
        steps.append(step(f"b{i}", f"p.b{i}", compensation=f"p.ub{i}", queue="q.commands"))
    steps.append(
        step(
            "pivot",
            "p.pivot",
            queue="q.commands",
            pivot=True,
            compensation="p.unpivot" if draw(st.booleans()) else None,
        )
    )
    previous = "pivot"
    for i in range(after):
        steps.append(
            step(
                f"a{i}",
                f"p.a{i}",
                queue="q.commands",
                depends_on=[previous],
                compensation=f"p.ua{i}" if draw(st.booleans()) else None,
                retry=draw(st.integers(min_value=1, max_value=3)),
                timeout=5,
            )
        )
        previous = draw(st.sampled_from([previous, "pivot"]))
    return saga("pivoted", *steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(defn=pivoted(), data=st.data())
def test_nothing_is_compensated_once_the_pivot_succeeded(
    defn: SagaDefinition, data: st.DataObject
) -> None:
    d = Driver(defn, saga_id=SAGA_ID)  # fixed: the retry jitter derives from its ids
    d.start()
    for _ in range(30):
        if d.state.status is not SagaStatus.RUNNING:
            break
        before = d.state
        passed = before.steps["pivot"].status is StepStatus.SUCCEEDED
        awaited = [n for n, x in before.steps.items() if x.status is StepStatus.REQUESTED]
        move = data.draw(st.sampled_from(["success", "failure", "silence"]))
        if move == "silence" or not awaited:
            if before.next_wake_at() is None:
                break
            decision = d.lapse()
        else:
            name = data.draw(st.sampled_from(awaited))
            outcome = Outcome.SUCCESS if move == "success" else Outcome.FAILURE
            decision = d.apply(d.reply(name, outcome))
        check(defn, before, decision)
        if passed:
            assert not any(c.kind is MessageKind.COMPENSATION for c in decision.commands)
            assert decision.state.status in (
                SagaStatus.RUNNING,
                SagaStatus.COMPLETED,
                SagaStatus.MANUAL_REVIEW,
            )
            assert all(
                x.status not in (StepStatus.COMPENSATING, StepStatus.COMPENSATED)
                for x in decision.state.steps.values()
            )
    if d.state.status is SagaStatus.COMPENSATED:
        pivot = d.state.steps["pivot"]
        assert pivot.status not in (StepStatus.SUCCEEDED, StepStatus.COMPENSATION_SKIPPED)
        assert pivot.status is not StepStatus.COMPENSATED or pivot.given_up


def test_a_failure_after_the_pivot_is_sent_again_as_a_new_command_then_goes_to_a_person():
    defn = saga(
        "r",
        step("receive", "w.receive", queue="w.commands", pivot=True),
        step(
            "notify", "n.notify", compensation="n.retract", queue="n.commands", retry=2, timeout=5
        ),
    )
    d = Driver(defn)
    d.start()
    d.succeed("receive")
    first = d.state.steps["notify"].command_id
    d.fail("notify", "smtp_down")
    assert d.state.status is SagaStatus.RUNNING and d.state.steps["notify"].awaits_retry
    d.lapse()
    again = d.state.steps["notify"]
    assert again.status is StepStatus.REQUESTED and again.command_id != first
    assert d.decisions[-1].commands[0].command_id == again.command_id
    d.fail("notify", "smtp_down")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert "after the pivot" in (d.state.reason or "")


def _returns_like(on_timeout: str = "compensate") -> SagaDefinition:
    return saga(
        "return",
        step("create", "r.create", compensation="r.cancel", queue="r.commands"),
        human_step("inspect", timeout=100, escalate_after=40, on_timeout=on_timeout),
        step(
            "refund",
            "p.refund",
            compensation="p.void",
            queue="p.commands",
            when=equals("inspect.decision", "accepted"),
        ),
    )


def test_a_human_step_escalates_then_its_policy_decides() -> None:
    d = Driver(_returns_like())
    d.start()
    d.succeed("create")
    assert d.state.steps["inspect"].status is StepStatus.REQUESTED
    assert not d.decisions[-1].commands, "a human step sends nothing"
    d.lapse()
    assert [h.event for h in d.decisions[-1].history] == ["signal_escalated"]
    d.lapse()
    assert d.state.status is SagaStatus.COMPENSATING
    assert d.state.steps["inspect"].error == "no_signal"
    assert d.decisions[-1].commands[0].step == "create"
    with pytest.raises(ActionRefused):
        d.signal("inspect", {"decision": "accepted"})

    d = Driver(_returns_like("manual_review"))
    d.start()
    d.succeed("create")
    d.lapse()
    d.lapse()
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["inspect"].status is StepStatus.TIMED_OUT


def test_a_signal_moves_the_saga_and_a_repeated_one_is_a_duplicate() -> None:
    d = Driver(_returns_like())
    d.start()
    d.succeed("create")
    d.signal("inspect", {"decision": "rejected"})
    assert d.state.status is SagaStatus.COMPLETED
    assert d.state.steps["refund"].not_taken
    again = d.signal("inspect", {"decision": "rejected"})
    assert not again.changed and again.history[0].event == "duplicate_signal"
    with pytest.raises(ActionRefused):
        d.signal("inspect", {"decision": "accepted"})
    with pytest.raises(ActionRefused):
        d.signal("create", {"decision": "accepted"})


def test_definitions_refuse_what_the_decider_could_not_honour() -> None:
    with pytest.raises(DefinitionError, match="not a step it depends on"):
        saga(
            "x",
            step("a", "p.a", queue="q"),
            step("b", "p.b", queue="q", depends_on=[], when=equals("a.v", 1)),
        )
    with pytest.raises(DefinitionError, match="one pivot"):
        saga("x", step("a", "p.a", queue="q", pivot=True), step("b", "p.b", queue="q", pivot=True))
    with pytest.raises(DefinitionError, match="manual_review"):
        saga("x", step("a", "p.a", queue="q", pivot=True), human_step("h"))
    with pytest.raises(TypeError):
        step("a", "p.a", queue="q", when=lambda p, r: True)  # type: ignore[arg-type]


@given(
    data=st.recursive(
        st.none() | st.integers() | st.text(max_size=3),
        lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    ),
    path=st.lists(st.text(alphabet="ab", min_size=1, max_size=2), min_size=1, max_size=3),
)
def test_reading_a_path_never_raises(data: Any, path: list[str]) -> None:
    results = {"s": data}
    value = read(".".join(["s", *path]), {}, results)
    for c in (equals(".".join(["s", *path]), 1), at_least(".".join(["s", *path]), 1)):
        assert c.holds({}, results) is (
            value == 1 if c.op == "==" else value == 1 or (isinstance(value, int) and value >= 1)
        )


@pytest.mark.parametrize(
    ("condition", "found", "holds"),
    [
        (equals("payload.v", 1), True, False),
        (equals("payload.v", 0), False, False),
        (equals("payload.v", True), 1, False),
        (equals("payload.v", 1), 1.0, True),
        (equals("payload.v", True), True, True),
        (not_equals("payload.v", 1), True, True),
        (one_of("payload.v", [1, "a"]), True, False),
        (one_of("payload.v", [0]), False, False),
        (one_of("payload.v", [True]), True, True),
        (at_least("payload.v", 1), True, False),
        (less("payload.v", 1), False, False),
        (at_least("payload.v", 1), 1.5, True),
        (at_least("payload.v", "2026-01-01"), "2026-02-01", True),
    ],
)
def test_conditions_compare_as_json_a_bool_is_no_number(
    condition: Condition, found: Any, holds: bool
) -> None:
    # Python's True == 1 (and False == 0, True >= 1) is not JSON's: a decision stored as
    # true must not take the branch of the number 1.
    assert condition.holds({"v": found}, {}) is holds


def test_two_conditions_are_one_only_when_their_values_are_one_json_value() -> None:
    # Versions compare conditions by value: moving a saga from `== 1` to `== true` changes
    # which branch it takes, so the two must differ.
    assert equals("payload.v", 1) != equals("payload.v", True)
    assert one_of("payload.v", [0]) != one_of("payload.v", [False])
    assert equals("payload.v", 1) == equals("payload.v", 1.0)
    assert hash(equals("payload.v", 1)) == hash(equals("payload.v", 1.0))
    with pytest.raises(ValueError, match="number or a string"):
        at_least("payload.v", True)


def test_a_different_decision_is_no_duplicate_even_where_python_calls_it_equal() -> None:
    d = Driver(_returns_like())
    d.start()
    d.succeed("create")
    d.signal("inspect", {"decision": "rejected", "urgent": True})
    assert d.signal("inspect", {"decision": "rejected", "urgent": True}).classification.value == (
        "duplicate"
    )
    with pytest.raises(ActionRefused):
        d.signal("inspect", {"decision": "rejected", "urgent": 1})


def _inspection(data: Any) -> dict[str, Any]:
    """A callable schema returning Python values JSON stores otherwise (a tuple)."""
    return {"decision": data["decision"], "photos": tuple(data.get("photos", ()))}


def _stored(d: Driver, name: str) -> None:
    """The state as the shell reads it back: results are JSON, as persistence writes them."""
    st_ = d.state.steps[name]
    stored = st_.evolve(result=json.loads(json.dumps(st_.result)))
    d.state = replace(d.state, steps={**d.state.steps, name: stored})


def test_a_decision_is_stored_as_the_json_its_schema_validated_so_a_retry_is_a_duplicate():
    defn = saga(
        "return",
        step("create", "r.create", compensation="r.cancel", queue="r.commands"),
        human_step("inspect", schema=_inspection, timeout=100),
    )
    d = Driver(defn)
    d.start()
    d.succeed("create")
    raw = {"decision": "accepted", "photos": ["p1", "p2"]}
    d.apply(SignalReceived("inspect", defn.step("inspect").human.validate(raw), "ann", "ok"))
    _stored(d, "inspect")
    # The client retries (its first answer was lost): the same decision, validated again.
    again = SignalReceived("inspect", defn.step("inspect").human.validate(raw), "ann", "ok")
    assert d.apply(again).classification is Classification.DUPLICATE


@pytest.mark.parametrize(
    ("returned", "where"),
    [
        ({"at": datetime(2026, 1, 1, tzinfo=UTC)}, "at as a datetime"),
        ({"amount": {"value": Decimal("1.10")}}, "amount.value as a Decimal"),
        ({"tags": [{"a", "b"}]}, r"tags\[0\] as a set"),
        ({"score": float("nan")}, "score as a float that is not finite"),
    ],
)
def test_a_schema_that_returns_what_json_has_not_is_refused_saying_where(
    returned: dict[str, Any], where: str
) -> None:
    # Stored, a datetime would read back as a string, a Decimal or a set not at all: the
    # decision must be refused before anything is written, naming the member, not its value.
    human = human_step("inspect", schema=lambda _: returned).human
    assert human is not None
    with pytest.raises(InvalidPayload, match=f"schema .* returned {where}.*must return JSON"):
        human.validate({"decision": "accepted"})
