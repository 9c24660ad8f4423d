"""The tutorial's two-step trip and its test without services, run as they are written."""

from __future__ import annotations

import re
import sys
import types

from tests.docs import page

TUTORIAL = page("tutorial.md")


def test_the_tutorials_trip_and_its_test_pass(monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    trip_source = next(b for b in blocks if "flights = Participant" in b)
    test_source = next(b for b in blocks if "from trip import TRIP" in b)
    trip = types.ModuleType("trip")
    exec(compile(trip_source, f"{TUTORIAL}:trip", "exec"), trip.__dict__)
    monkeypatch.setitem(sys.modules, "trip", trip)
    namespace: dict[str, object] = {"__name__": "tutorial_test"}
    exec(compile(test_source, f"{TUTORIAL}:test", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # type: ignore[operator]
