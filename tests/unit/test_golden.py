"""Golden histories (``saga_tasks.testing.golden``): a run recorded beside its test,
replayed against the definition; a change of behaviour is a diff, never a silent pass."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga_tasks import human_step, saga, step
from saga_tasks.testing import SagaDriver, golden
from saga_tasks.testing.golden import GoldenMismatch


def _trip(flight_timeout: float = 30):
    return saga(
        "trip",
        step("hotel", "hotels.book", compensation="hotels.cancel", queue="hotels.commands"),
        step(
            "flight",
            "flights.book",
            compensation="flights.cancel",
            queue="flights.commands",
            depends_on=["hotel"],
            timeout=flight_timeout,
        ),
        human_step("approve", depends_on=["flight"], timeout=3600),
    )


TRIP = _trip()


def _sold_out(definition=TRIP) -> SagaDriver:
    d = SagaDriver(definition, payload={"guest_ref": "g-1"})
    d.start()
    d.succeed("hotel", {"booking_ref": "h-1"})
    d.fail("flight", "sold_out")
    d.compensated("hotel")
    return d


def test_a_missing_file_is_written_and_fails_once_then_the_same_run_passes(tmp_path):
    path = tmp_path / "golden" / "trip_sold_out.json"
    with pytest.raises(GoldenMismatch, match="did not exist: it is written now"):
        golden.check(_sold_out(), path)
    document = json.loads(path.read_text())
    assert [t["event"]["type"] for t in document["turns"]] == [
        "Started",
        "ReplyReceived",
        "ReplyReceived",
        "ReplyReceived",
    ]
    assert document["turns"][-1]["decision"]["status"] == "COMPENSATED"
    golden.check(_sold_out(), path)  # a second run of the same test: no diff


def test_a_changed_definition_shows_as_a_diff_and_the_update_switch_accepts_it(
    tmp_path, monkeypatch
):
    path = tmp_path / "trip.json"
    monkeypatch.setenv(golden.UPDATE, "1")
    golden.check(_sold_out(), path)  # written, and passes, under the switch
    monkeypatch.delenv(golden.UPDATE)

    # A release where the flight's deadline is longer: the same events decide otherwise.
    slower = _trip(flight_timeout=90)
    with pytest.raises(GoldenMismatch) as differs:
        golden.check(_sold_out(slower), path)
    diff = str(differs.value)
    assert "its events decided now" in diff and "the test's run" in diff
    assert '"deadline": 30.02' in diff and '"deadline": 90.02' in diff
    assert f"{golden.UPDATE}=1 rewrites" in diff

    monkeypatch.setenv(golden.UPDATE, "1")
    golden.check(_sold_out(slower), path)
    monkeypatch.delenv(golden.UPDATE)
    golden.check(_sold_out(slower), path)


def test_an_edited_scenario_is_not_taken_for_the_recorded_one(tmp_path):
    path = tmp_path / "trip.json"
    with pytest.raises(GoldenMismatch):
        golden.check(_sold_out(), path)
    d = SagaDriver(TRIP, payload={"guest_ref": "g-1"})
    d.start()
    d.succeed("hotel", {"booking_ref": "h-1"})
    with pytest.raises(GoldenMismatch, match="the test's run"):
        golden.check(d, path)


def test_replay_needs_the_file_alone_and_refuses_another_saga(tmp_path):
    path = tmp_path / "trip.json"
    path.write_text(json.dumps(golden.record(_sold_out())))
    assert golden.replay(TRIP, path) == json.loads(path.read_text())
    other = saga("cruise", step("cabin", "ships.book", queue="ships.commands"))
    with pytest.raises(GoldenMismatch, match="records a 'trip' saga, not 'cruise'"):
        golden.replay(other, path)
    path.write_text("{")
    with pytest.raises(GoldenMismatch, match="is not JSON"):
        golden.replay(TRIP, path)


def test_runs_repeat_with_the_same_ids():
    assert golden.record(_sold_out()) == golden.record(_sold_out())


ACTIONS = st.lists(
    st.sampled_from(
        ["succeed"] * 4 + ["signal"] * 2 + ["fail", "compensated", "lapse", "tick", "dup"]
    ),
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_every_recorded_run_replays_to_itself(tmp_path_factory, actions):
    """Whatever events a run was fed (replies, duplicates, deadlines with dispatch times,
    signals), its file decodes to the same events and replays to the same decisions."""
    d = SagaDriver(TRIP, payload={"guest_ref": "g-1"})
    d.start()
    for action in actions:
        waiting = [n for n, s in d.state.steps.items() if s.in_flight]
        name = waiting[0] if waiting else "hotel"
        if action == "succeed":
            d.succeed(name, {"ref": name})
        elif action == "fail":
            d.fail(name, "refused")
        elif action == "compensated":
            d.compensated(name)
        elif action == "lapse" and d.state.next_wake_at() is not None:
            d.lapse(backlog={"hotels.commands": 1}, dispatch={name: d.now - timedelta(seconds=1)})
        elif action == "tick":
            d.tick(7.5)
        elif action == "signal" and d.state.steps["approve"].in_flight:
            d.signal("approve", {"ok": True})
        elif action == "dup" and d.events:
            d.apply(d.events[-1][1])
    path = tmp_path_factory.mktemp("golden") / "run.json"
    path.write_text(json.dumps(golden.record(d)))
    assert golden.replay(TRIP, path) == golden.record(d)
