"""``migrate``: moving an unfinished saga to another version of its definition, over random
DAG sagas driven to random states by replies and deadlines (hypothesis).

Properties: migrating to an identical definition changes nothing but the version and the
history; a refused migration changes nothing; after a migration every step that is not
PENDING is in the new definition, unchanged, and the decider's invariants hold.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from saga_tasks import equals, human_step
from saga_tasks.core.decider import migrate
from saga_tasks.core.decider.migrate import MIGRATED
from saga_tasks.core.definitions import SagaDefinition, Step, saga, step
from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.core.model import SagaState, StepState
from saga_tasks.core.states import (
    IN_FLIGHT,
    TERMINAL_SAGA,
    MessageKind,
    Outcome,
    SagaStatus,
    StepStatus,
)
from saga_tasks.errors import ActionRefused
from tests.unit.sagas import Driver, check, linear

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


VALUES = st.sampled_from(["a", "b", 1, None])


@st.composite
def definitions(draw: st.DrawFn) -> SagaDefinition:
    """Random DAGs of participant and human steps, some with conditions, one maybe a pivot."""
    n = draw(st.integers(min_value=1, max_value=5))
    pivot = draw(st.integers(0, 2 * n))  # a pivot one time in two
    steps = []
    ancestors: dict[str, set[str]] = {}
    for i in range(n):
        picked = draw(st.sets(st.integers(0, i - 1), max_size=2)) if i else set()
        parents = [f"s{p}" for p in sorted(picked)]
        ancestors[f"s{i}"] = set(parents).union(*(ancestors[p] for p in parents))
        readable = ["payload", *sorted(ancestors[f"s{i}"])]
        when = (
            equals(f"{draw(st.sampled_from(readable))}.v", draw(VALUES))
            if draw(st.integers(0, 3)) == 0
            else None
        )
        common = {"depends_on": parents, "when": when, "pivot": i == pivot}
        if i and draw(st.integers(0, 4)) == 0:
            steps.append(human_step(f"s{i}", timeout=10, on_timeout="manual_review", **common))
            continue
        steps.append(
            step(
                f"s{i}",
                f"p.do{i}",
                compensation=f"p.undo{i}" if draw(st.integers(0, 3)) else None,
                queue=f"q{i % 2}.commands",
                timeout=draw(st.sampled_from([5.0, 10.0])),
                retry=draw(st.integers(1, 2)),
                **common,
            )
        )
    return saga("versioned", *steps, timeout=120)


def driven(defn: SagaDefinition, data: st.DataObject) -> Driver:
    """A saga of ``defn`` moved by random answers, signals and deadlines: a state the shell
    stores."""
    d = Driver(defn, payload={"v": data.draw(VALUES, label="payload")})
    d.start()
    for _ in range(data.draw(st.integers(0, 5), label="events")):
        in_flight = [n for n, s in d.state.steps.items() if s.status in IN_FLIGHT or s.fencing]
        if d.state.status in TERMINAL_SAGA or not in_flight:
            break
        if d.state.next_wake_at() and data.draw(st.integers(0, 5), label="deadline") == 0:
            d.lapse()
            continue
        name = data.draw(st.sampled_from(in_flight), label="step")
        st_ = d.state.steps[name]
        value = {"v": data.draw(VALUES, label="result")}
        if defn.step(name).human is not None and st_.status is StepStatus.REQUESTED:
            if d.state.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
                d.signal(name, value)
            continue
        kind = (
            MessageKind.COMMAND if st_.status is StepStatus.REQUESTED else MessageKind.COMPENSATION
        )
        outcome = data.draw(st.sampled_from([*[Outcome.SUCCESS] * 5, Outcome.FAILURE]))
        d.apply(d.reply(name, outcome, kind=kind, result=value))
    return d


@st.composite
def versions(draw: st.DrawFn, old: SagaDefinition) -> SagaDefinition:
    """Version 2 of ``old``: steps kept, changed or dropped, new ones added."""
    kept: list[Step] = []
    for s in old.steps:
        fate = draw(st.sampled_from([*["keep"] * 5, "change", "drop"]), label=s.name)
        if fate == "drop":
            continue
        kept.append(replace(s, timeout=s.timeout + timedelta(seconds=1)) if fate == "change" else s)
    names = {s.name for s in kept}
    # A step keeps only parents that are kept, and no condition that reads a step no
    # longer among its ancestors (a grandparent dropped, say).
    ancestors: dict[str, set[str]] = {}
    rebuilt: list[Step] = []
    for s in kept:  # in the old dependency order, so parents come first
        parents = tuple(p for p in s.depends_on if p in names)
        ancestors[s.name] = set(parents).union(*(ancestors[p] for p in parents))
        heads = {path.split(".")[0] for path in (s.when.paths() if s.when else ())}
        readable = heads <= ancestors[s.name] | {"payload"}
        rebuilt.append(replace(s, depends_on=parents, when=s.when if readable else None))
    kept = rebuilt
    for j in range(draw(st.integers(0, 2), label="added")):
        parents = draw(st.sets(st.sampled_from(sorted(names)), max_size=2)) if names else set()
        kept.append(
            step(f"n{j}", f"p.new{j}", compensation=f"p.unnew{j}", queue="q0.commands",
                 depends_on=sorted(parents))
        )  # fmt: skip
        names.add(f"n{j}")
    if not kept:
        kept = [step("n9", "p.new9", queue="q0.commands")]
    return saga(old.saga_type, *kept, version=2, timeout=old.timeout)


def compatible(old: SagaDefinition, new: SagaDefinition, state: SagaState) -> bool:
    return all(
        new.by_name.get(s.name) == s
        for s in old.steps
        if state.steps[s.name].status is not StepStatus.PENDING
    )


def migrated(old: SagaDefinition, new: SagaDefinition, state: SagaState):
    return migrate(
        old, new, state, actor="ana", reason="v2 ships the fix", now=state.created_at + timedelta(1)
    )


@SETTINGS
@given(defn=definitions(), data=st.data())
def test_an_identical_definition_changes_nothing_but_the_version_and_history(
    defn: SagaDefinition, data: st.DataObject
) -> None:
    state = driven(defn, data).state
    same = replace(defn, version=2)
    if state.status in TERMINAL_SAGA:
        with pytest.raises(ActionRefused, match=f"the saga is {state.status.value}"):
            migrated(defn, same, state)
        return
    decision = migrated(defn, same, state)
    assert decision.state == replace(state, definition_version=2, version=state.version + 1)
    assert decision.commands == ()
    (entry,) = decision.history
    assert entry.event == MIGRATED and entry.reason == "operator ana: v2 ships the fix"
    assert entry.saga_status_before is entry.saga_status_after is state.status
    assert dict(entry.detail) == {
        "actor": "ana",
        "from_version": 1,
        "to_version": 2,
        "added_steps": [],
        "dropped_steps": [],
    }
    back = migrate(same, defn, decision.state, actor="ana", reason="back", now=state.created_at)
    assert back.state == replace(state, version=state.version + 2)


@SETTINGS
@given(defn=definitions(), data=st.data())
def test_a_migration_keeps_every_step_begun_or_is_refused_and_changes_nothing(
    defn: SagaDefinition, data: st.DataObject
) -> None:
    state = driven(defn, data).state
    new = data.draw(versions(defn))
    snapshot = copy.deepcopy(state)
    try:
        decision = migrated(defn, new, state)
    except ActionRefused as exc:
        event(f"refused, {state.status.value}")
        assert state == snapshot, "a refused migration changes nothing"
        assert state.status in TERMINAL_SAGA or not compatible(defn, new, state), str(exc)
        return
    event(f"migrated, {state.status.value}, {len(decision.commands)} sent")
    assert state.status not in TERMINAL_SAGA and compatible(defn, new, state)
    after = decision.state
    assert after.definition_version == 2 and set(after.steps) == set(new.by_name)
    for name, st_ in after.steps.items():
        assert name in new.by_name
        if st_.status is StepStatus.PENDING:
            continue
        if name in state.steps and state.steps[name].status is not StepStatus.PENDING:
            assert new.step(name) == defn.step(name), "begun before: unchanged in version 2"
            assert st_ == state.steps[name] or decision.commands, "and left as it was"
        else:  # pending before: the saga went on under version 2, or compensates
            waits_for_a_person = (
                new.step(name).human is not None and st_.status is StepStatus.REQUESTED
            )  # a human step is asked of a person: no command is sent
            assert (
                any(c.step == name for c in decision.commands)
                or st_.status is StepStatus.SKIPPED
                or waits_for_a_person
            )
    assert decision.history[0].event == MIGRATED
    # The decider's own invariants, the steps new to the saga read as never sent.
    before = replace(
        state,
        definition_version=2,
        steps={n: state.steps.get(n, StepState()) for n in new.by_name},
    )
    check(new, before, decision, operator=True)


def test_a_new_step_whose_parents_succeeded_is_sent_at_once():
    """Without it a saga with nothing else in flight would wait for an answer that never
    comes."""
    old = linear(2)
    d = Driver(old)
    d.start()
    d.succeed("s0")  # s1 in flight
    extra = step("audit", "p.audit", queue="p.commands", depends_on=["s0"])
    new = saga("linear", *old.steps, extra, version=2, timeout=600)
    decision = migrated(old, new, d.state)
    assert [(c.step, c.kind) for c in decision.commands] == [("audit", MessageKind.COMMAND)]
    assert decision.state.steps["audit"].status is StepStatus.REQUESTED
    assert decision.state.status is SagaStatus.RUNNING


def test_a_dropped_pending_step_can_complete_the_saga():
    old = linear(3)
    d = Driver(old)
    d.start()
    d.succeed("s0")
    new = saga("linear", *old.steps[:2], version=2, timeout=600)
    decision = migrated(old, new, d.state)
    assert set(decision.state.steps) == {"s0", "s1"}
    assert decision.history[0].detail["dropped_steps"] == ["s2"]
    d2 = Driver(new, saga_id=d.state.saga_id)
    d2.state = decision.state
    assert d2.succeed("s1").state.status is SagaStatus.COMPLETED


def test_refusals_say_why():
    old = linear(3)
    d = Driver(old)
    d.start()
    d.succeed("s0")  # s1 in flight
    slower = replace(old.step("s1"), timeout=timedelta(seconds=45))
    changed = saga("linear", old.step("s0"), slower, old.step("s2"), version=2, timeout=600)
    with pytest.raises(ActionRefused, match=r"step 's1' is REQUESTED and differs there "
                       r"\(timeout 30 s -> 45 s\)"):  # fmt: skip
        migrated(old, changed, d.state)
    without = saga("linear", old.step("s0"), version=2, timeout=600)
    with pytest.raises(ActionRefused, match="'s1' is REQUESTED and version 2 has no such step"):
        migrated(old, without, d.state)
    with pytest.raises(ActionRefused, match="already runs version 1"):
        migrated(old, old, d.state)
    other = saga("other", *old.steps, version=2)
    with pytest.raises(ActionRefused, match="to a definition of 'other'"):
        migrated(old, other, d.state)
    with pytest.raises(ActionRefused, match="needs an actor and a reason"):
        migrate(old, replace(old, version=2), d.state, actor=" ", reason="why", now=d.now)


def test_a_new_condition_cannot_read_a_step_done_by_hand():
    """Done by hand, s0 has no result of its own: a branch on it would read null and be
    passed over, as skip-step refuses for the steps a condition of the saga reads."""
    old = linear(2)
    d = Driver(old)
    d.start()
    d.apply(OperatorAction(OperatorVerb.SKIP_STEP, actor="ana", reason="by hand", step="s0"))
    assert d.state.steps["s0"].result == {"skipped_by": "ana"}
    branch = step("gift", "p.gift", queue="p.commands", depends_on=["s0"],
                  when=equals("s0.v", "a"))  # fmt: skip
    new = saga("linear", *old.steps, branch, version=2, timeout=600)
    with pytest.raises(ActionRefused, match=r"condition of step 'gift' .* reads step 's0', "
                       "which was done by hand"):  # fmt: skip
        migrated(old, new, d.state)
    plain = saga("linear", *old.steps, replace(branch, when=None), version=2, timeout=600)
    assert migrated(old, plain, d.state).state.steps["gift"].status is StepStatus.REQUESTED


def test_a_payload_the_new_version_refuses_refuses_the_migration():
    old = linear(2)
    d = Driver(old)
    d.start()

    def needs_y(payload):
        if "y" not in payload:
            raise ValueError("y: Field required")
        return payload

    new = saga("linear", *old.steps, version=2, timeout=600, payload=needs_y)
    with pytest.raises(ActionRefused, match=r"payload does not fit it .*y: Field required"):
        migrated(old, new, d.state)


def test_steps_new_to_a_compensating_saga_are_skipped():
    old = linear(2)
    d = Driver(old)
    d.start()
    d.succeed("s0")
    d.fail("s1")  # s0's compensation in flight
    assert d.state.status is SagaStatus.COMPENSATING
    extra = step("audit", "p.audit", queue="p.commands", depends_on=["s0"])
    new = saga("linear", *old.steps, extra, version=2, timeout=600)
    decision = migrated(old, new, d.state)
    assert decision.state.steps["audit"].status is StepStatus.SKIPPED
    assert decision.commands == ()


def test_a_branch_not_taken_is_not_a_compensation_begun():
    """A step skipped by its condition leaves the saga going forward: steps new to it
    start PENDING and are sent once ready."""
    old = saga(
        "branchy",
        step("a", "p.a", compensation="p.ua", queue="p.commands"),
        step("b", "p.b", queue="p.commands", depends_on=["a"], when=equals("payload.v", 2)),
        step("c", "p.c", compensation="p.uc", queue="p.commands", depends_on=["a"]),
    )
    d = Driver(old, payload={"v": 1})
    d.start()
    d.succeed("a")  # b not taken, c in flight
    assert d.state.steps["b"].not_taken
    extra = step("audit", "p.audit", queue="p.commands", depends_on=["a"])
    new = saga("branchy", *old.steps, extra, version=2)
    decision = migrated(old, new, d.state)
    assert decision.state.steps["audit"].status is StepStatus.REQUESTED
    assert [c.step for c in decision.commands] == ["audit"]


def test_a_human_step_built_again_from_the_same_schema_is_unchanged():
    from pydantic import BaseModel

    class Inspection(BaseModel):
        decision: str

    def version(n: int, escalate: float) -> SagaDefinition:
        return saga(
            "inspected",
            step("receive", "w.receive", compensation="w.undo", queue="w.commands"),
            human_step("inspect", schema=Inspection, timeout=60, escalate_after=escalate),
            version=n,
        )

    old = version(1, 30)
    d = Driver(old)
    d.start()
    d.succeed("receive")  # inspect waits for a person
    assert migrated(old, version(2, 30), d.state).state.definition_version == 2
    with pytest.raises(ActionRefused, match=r"'inspect' is REQUESTED and differs there \(human"):
        migrated(old, version(2, 45), d.state)
