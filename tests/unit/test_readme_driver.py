"""The README's ``SagaDriver`` example ("Testing your own sagas"), run as it is written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_driver_example_passes():
    section = README.read_text().split("## Testing your own sagas", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    source = next((b for b in blocks if "SagaDriver" in b), None)
    assert source is not None, "the README lost its SagaDriver example"
    namespace: dict[str, object] = {"__name__": "readme_driver"}
    exec(compile(source, str(README), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        test()  # type: ignore[operator]
