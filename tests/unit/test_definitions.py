"""Definitions are validated when built, with a typed error naming the problem."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_tasks import Participant, saga, step
from saga_tasks.core.definitions import LateReplyPolicy, RetryPolicy
from saga_tasks.errors import (
    DefinitionError,
    DependencyCycle,
    DuplicateStep,
    InvalidPayload,
    MissingQueue,
    UnknownDependency,
)


def s(name: str, **kw):
    kw.setdefault("queue", "p.commands")
    return step(name, f"p.{name}", **kw)


def test_plain_list_is_linear():
    d = saga("t", s("a"), s("b"), s("c"))
    assert [x.name for x in d.steps] == ["a", "b", "c"]
    assert d.parents == {"a": (), "b": ("a",), "c": ("b",)}
    assert d.descendants("a") == {"b", "c"}


def test_explicit_roots_and_fan_in():
    d = saga("t", s("a", depends_on=()), s("b", depends_on=()), s("c", depends_on=["a", "b"]))
    assert d.parents["c"] == ("a", "b")
    assert d.children["a"] == ("c",)


def test_steps_are_reordered_so_parents_come_first():
    d = saga("t", s("c", depends_on=["b"]), s("b", depends_on=["a"]), s("a", depends_on=()))
    assert [x.name for x in d.steps] == ["a", "b", "c"]


def test_duplicate_step():
    with pytest.raises(DuplicateStep, match="step 'a' is defined twice"):
        saga("t", s("a"), s("a"))


def test_unknown_dependency():
    with pytest.raises(UnknownDependency, match="step 'b' depends on unknown step 'zz'"):
        saga("t", s("a"), s("b", depends_on=["zz"]))


def test_cycle_names_its_steps():
    with pytest.raises(DependencyCycle, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        saga("t", s("a", depends_on=["b"]), s("b", depends_on=["a"]))


def test_self_dependency_is_a_cycle():
    with pytest.raises(DependencyCycle):
        saga("t", s("a", depends_on=["a"]))


def test_missing_queue():
    with pytest.raises(MissingQueue, match="step 'a' has no queue"):
        saga("t", step("a", "p.a"))


def test_queue_comes_from_a_handler():
    class Target:
        task_name = "inventory.reserve"
        queue = "inventory.commands"

    d = saga("t", step("a", Target(), compensation=Target()))
    assert d.steps[0].queue == "inventory.commands"
    assert d.steps[0].action == "inventory.reserve"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: saga("", s("a")), "non-empty word"),
        (lambda: saga("t"), "at least one step"),
        (lambda: saga("t", s("a"), version=0), "version"),
        (lambda: saga("t", s("a", timeout=0)), "positive timeout"),
        (lambda: saga("t", s("a"), s("b", depends_on=["a", "a"])), "twice"),
    ],
)
def test_other_problems_are_definition_errors(build, message):
    with pytest.raises(DefinitionError, match=message):
        build()


def test_a_human_steps_schema_fields_are_recorded_where_it_is_defined():
    """The step keeps a closure around the model's validator, which tells no fields:
    what a form lists is read from the model when the step is defined."""
    from typing import Literal

    from pydantic import BaseModel

    from saga_tasks import human_step
    from saga_tasks.core.definitions import SignalField

    class Decision(BaseModel):
        decision: Literal["accepted", "rejected"]
        amount_cents: int
        tags: list[str] = []
        note: str | None = None

    fields = human_step("decide", schema=Decision).human.fields
    assert fields == (
        SignalField("decision", '"accepted" | "rejected"', required=True),
        SignalField("amount_cents", "integer", required=True),
        SignalField("tags", "array of string", required=False),
        SignalField("note", "string | null", required=False),
    )
    assert human_step("any").human.fields == ()
    assert human_step("callable", schema=dict).human.fields == ()


def test_policies_and_timeouts():
    x = step("a", "p.a", queue="q", timeout=2.5, retry=4, late_reply="ignore")
    assert x.timeout == timedelta(seconds=2.5)
    assert x.retry == RetryPolicy(max_attempts=4)
    assert x.late_reply is LateReplyPolicy.IGNORE
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(max_attempts=0)


def test_payload_validation_names_fields_without_values():
    from pydantic import BaseModel

    class Payload(BaseModel):
        customer_id: str
        amount: int

    d = saga("t", s("a"), payload=Payload)
    assert d.validate_payload({"customer_id": "c", "amount": 3}) == {
        "customer_id": "c",
        "amount": 3,
    }
    with pytest.raises(InvalidPayload) as info:
        d.validate_payload({"customer_id": "secret-name", "amount": "many"})
    assert "amount" in str(info.value)
    assert "many" not in str(info.value)
    with pytest.raises(InvalidPayload, match="JSON object"):
        saga("t", s("a")).validate_payload([1])


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 7))
    edges = {i: draw(st.sets(st.integers(0, n - 1), max_size=3)) for i in range(n)}
    return n, edges


def _has_cycle(n, edges):
    state = {}

    def visit(v):
        if state.get(v) == 1:
            return True
        if state.get(v) == 2:
            return False
        state[v] = 1
        if any(visit(p) for p in edges[v]):
            return True
        state[v] = 2
        return False

    return any(visit(v) for v in range(n))


@settings(max_examples=300)
@given(graphs())
def test_any_graph_is_accepted_in_dependency_order_or_refused_as_a_cycle(graph):
    n, edges = graph
    steps = [s(f"n{i}", depends_on=[f"n{p}" for p in sorted(edges[i])]) for i in range(n)]
    if _has_cycle(n, edges):
        with pytest.raises(DependencyCycle):
            saga("g", *steps)
        return
    d = saga("g", *steps)
    position = {x.name: i for i, x in enumerate(d.steps)}
    for x in d.steps:
        assert all(position[p] < position[x.name] for p in x.depends_on)


def test_a_compensation_on_another_participants_queue_is_refused():
    from saga_tasks import Participant
    from saga_tasks.errors import CrossParticipantCompensation

    orders, inventory = Participant("orders"), Participant("inventory")

    @orders.command("create")
    def create(ctx):  # pragma: no cover - never run
        return {}

    @inventory.compensation("release", undoes="create")
    def release(ctx):  # pragma: no cover - never run
        return {}

    with pytest.raises(CrossParticipantCompensation, match="more than one queue"):
        saga("x", step("a", create, compensation=release))
    with pytest.raises(CrossParticipantCompensation, match="more than one queue"):
        saga("x", step("a", create, queue="inventory.commands"))


def test_the_app_refuses_task_names_of_two_participants_for_one_step():
    from saga_tasks import Participant, SagaApp, Settings
    from saga_tasks.errors import CrossParticipantCompensation

    orders, inventory = Participant("orders"), Participant("inventory")

    @orders.command("create")
    def create(ctx):  # pragma: no cover - never run
        return {}

    @inventory.compensation("release", undoes="create")
    def release(ctx):  # pragma: no cover - never run
        return {}

    settings = Settings.from_env({})
    by_name = saga(
        "x", step("a", "orders.create", compensation="inventory.release", queue="orders.commands")
    )
    with pytest.raises(CrossParticipantCompensation, match="belongs to orders"):
        SagaApp(sagas=[by_name], participants=[orders, inventory], settings=settings)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "16", None])
def test_a_participant_batch_is_a_whole_number_of_commands(bad):
    with pytest.raises(ValueError, match="batch must be a whole number of commands"):
        Participant("orders", batch=bad)


def test_a_participant_runs_each_command_alone_unless_it_says_batch():
    assert Participant("orders").batch == 1
    assert Participant("orders", batch=16).batch == 16


def test_a_compensation_must_undo_a_command_of_its_own_participant():
    from saga_tasks import Participant, SagaApp, Settings
    from saga_tasks.errors import ConfigurationError

    inventory = Participant("inventory")

    @inventory.command("reserve")
    def reserve(ctx):  # pragma: no cover - never run
        return {}

    @inventory.compensation("release", undoes="reserv")
    def release(ctx):  # pragma: no cover - never run
        return {}

    with pytest.raises(ConfigurationError, match=r"inventory.release undoes 'reserv', which"):
        SagaApp(sagas=[], participants=[inventory], settings=Settings.from_env({}))


def test_a_step_compensated_by_what_undoes_another_command_is_refused():
    from saga_tasks import Participant, SagaApp, Settings
    from saga_tasks.errors import CrossParticipantCompensation

    payments = Participant("payments")

    @payments.command("authorize")
    def authorize(ctx):  # pragma: no cover - never run
        return {}

    @payments.command("refund")
    def refund(ctx):  # pragma: no cover - never run
        return {}

    @payments.compensation("void", undoes="authorize")
    def void(ctx):  # pragma: no cover - never run
        return {}

    wrong = saga("x", step("pay_back", refund, compensation=void))
    with pytest.raises(CrossParticipantCompensation, match=r"undoes payments\.authorize, not"):
        SagaApp(sagas=[wrong], participants=[payments], settings=Settings.from_env({}))
