"""The testing guide's ``SagaDriver`` example, run as it is written."""

from __future__ import annotations

import re

import pytest

from saga_tasks.testing.golden import GoldenMismatch
from tests.docs import page

GUIDE = page("guides/testing.md")


def test_the_testing_guide_driver_example_passes():
    section = GUIDE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    source = next((b for b in blocks if "SagaDriver(" in b and "golden" not in b), None)
    assert source is not None, "the testing guide lost its SagaDriver example"
    namespace: dict[str, object] = {"__name__": "readme_driver"}
    exec(compile(source, str(GUIDE), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        test()  # type: ignore[operator]


def test_the_testing_guide_golden_example_fails_once_then_passes(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    driver = next(b for b in blocks if "SagaDriver(" in b and "golden" not in b)
    source = next((b for b in blocks if "golden.check" in b), None)
    assert source is not None, "the testing guide lost its golden example"
    namespace: dict[str, object] = {"__name__": "guide_golden", "__file__": str(tmp_path / "t.py")}
    exec(compile(driver, str(GUIDE), "exec"), namespace)
    exec(compile(source, str(GUIDE), "exec"), namespace)
    test = namespace["test_a_sold_out_trip_decides_as_recorded"]
    with pytest.raises(GoldenMismatch, match="written now"):
        test()  # type: ignore[operator]
    assert (tmp_path / "golden" / "trip_sold_out.json").exists()
    test()  # type: ignore[operator]
