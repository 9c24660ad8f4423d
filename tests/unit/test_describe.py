"""``saga-tasks describe``: a definition as data and as a Mermaid diagram."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from saga_tasks import saga, step
from saga_tasks.ops import cli
from saga_tasks.ops.describe import describe, mermaid


@st.composite
def dags(draw):
    """Acyclic graphs: each step depends on some of those before it."""
    n = draw(st.integers(1, 8))
    parents = {
        i: draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set() for i in range(n)
    }
    compensable = [draw(st.booleans()) for _ in range(n)]
    steps = [
        step(
            f"n{i}",
            f"p.do{i}",
            compensation=f"p.undo{i}" if compensable[i] else None,
            queue="p.commands",
            depends_on=[f"n{p}" for p in sorted(parents[i])],
        )
        for i in range(n)
    ]
    return saga("g", *steps), parents, compensable


@given(dags())
def test_the_diagram_has_a_node_per_step_and_an_edge_per_dependency(graph):
    definition, parents, compensable = graph
    drawn = mermaid(definition)
    ids = dict(re.findall(r'^\s+(s\d+)\[\[?"(n\d+)<br/>', drawn, re.M))
    assert sorted(ids.values()) == sorted(f"n{i}" for i in range(len(parents)))
    edges = {(ids[a], ids[b]) for a, b in re.findall(r"^\s+(s\d+) --> (s\d+)$", drawn, re.M)}
    assert edges == {(f"n{p}", f"n{i}") for i, ps in parents.items() for p in ps}
    double = {name for node, name in ids.items() if f'{node}[["' in drawn}
    assert double == {f"n{i}" for i, c in enumerate(compensable) if not c}


def test_the_order_saga_described_in_json():
    from participants.order_saga import order_saga

    data = describe(order_saga())
    assert data["saga_type"] == "order" and data["version"] == 1
    names = [s["name"] for s in data["steps"]]
    assert names == ["create_order", "reserve_stock", "authorize_payment", "confirm_order"]
    confirm = data["steps"][-1]
    assert confirm["compensation"] is None and not confirm["compensable"]
    assert confirm["depends_on"] == ["authorize_payment"]
    assert data["steps"][0]["retry"] == {
        "max_attempts": 3,
        "backoff": 2.0,
        "max_interval_seconds": 300.0,
        "jitter": 0.25,
    }
    json.dumps(data)  # JSON-ready


def test_the_cli_describes_a_type_and_refuses_an_unknown_one():
    runner = CliRunner()
    app = ["--app", "participants.app:saga_app"]
    shown = runner.invoke(cli.main, [*app, "describe", "order", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["steps"][0]["name"] == "create_order"
    text = runner.invoke(cli.main, [*app, "describe", "order"])
    assert text.exit_code == 0 and "flowchart LR" in text.output
    assert "cannot be undone" in text.output
    assert "\\n" not in text.output, "the diagram printed with literal \\n for its lines"
    assert "\nflowchart LR\n    s0[" in text.output, "Mermaid reads one statement a line"
    unknown = runner.invoke(cli.main, [*app, "describe", "nope"])
    assert unknown.exit_code == 2
    version = runner.invoke(cli.main, [*app, "describe", "order", "--version", "9"])
    assert version.exit_code != 0


def test_the_returns_saga_shows_its_branch_pivot_and_person():
    runner = CliRunner()
    app = ["--app", "participants.app:saga_app"]
    shown = runner.invoke(cli.main, [*app, "describe", "return", "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    by_name = {s["name"]: s for s in data["steps"]}
    assert data["saga_type"] == "return" and data["pivot"] == "refund"
    assert by_name["refund"]["pivot"] and by_name["refund"]["when"] == (
        "inspect.decision == 'accepted'"
    )
    assert by_name["send_back"]["when"] == "inspect.decision == 'rejected'"
    assert by_name["inspect"]["human"]["schema"] == "Inspection"
    assert by_name["inspect"]["human"]["on_timeout"] == "compensate"
    assert '{{"inspect<br/>a person decides"}}' in data["mermaid"]
    assert "<b>refund (pivot)</b>" in data["mermaid"]
    assert "-- \"inspect.decision == 'accepted'\" -->" in data["mermaid"]
    text = runner.invoke(cli.main, [*app, "describe", "return"])
    assert text.exit_code == 0
    assert "a person decides (Inspection)" in text.output and "PIVOT" in text.output


def test_the_text_prints_the_diagram_one_line_per_line():
    from participants.order_saga import order_saga

    runner = CliRunner()
    text = runner.invoke(cli.main, ["--app", "participants.app:saga_app", "describe", "order"])
    assert text.exit_code == 0, text.output
    assert "\\n" not in text.output
    assert text.output.rstrip("\n").endswith(mermaid(order_saga()))
