"""The README's "Testing your own sagas" example, run as it is written there."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    section = README.read_text().split("## Testing your own sagas", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README lost its example test"
    return match.group(1)


def test_the_readme_example_test_passes(template_database):
    source = _example()
    assert len(source.splitlines()) <= 32, "the README promises a short example"
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(source, str(README), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()  # type: ignore[operator]
