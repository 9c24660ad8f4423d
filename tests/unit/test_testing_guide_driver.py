"""The testing guide's ``SagaDriver`` example, run as it is written."""

from __future__ import annotations

import re

from tests.docs import page

GUIDE = page("guides/testing.md")


def test_the_testing_guide_driver_example_passes():
    section = GUIDE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    source = next((b for b in blocks if "SagaDriver" in b), None)
    assert source is not None, "the testing guide lost its SagaDriver example"
    namespace: dict[str, object] = {"__name__": "readme_driver"}
    exec(compile(source, str(GUIDE), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        test()  # type: ignore[operator]
