"""The "Testing your own sagas" guide's example, run as it is written there."""

from __future__ import annotations

import re

from tests.docs import page

GUIDE = page("guides/testing.md")


def _example() -> str:
    section = GUIDE.read_text()
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the testing guide lost its example test"
    return match.group(1)


def test_the_testing_guide_example_passes(template_database):
    source = _example()
    assert len(source.splitlines()) <= 32, "the guide promises a short example"
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(source, str(GUIDE), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # type: ignore[operator]
