"""The imports of the README and the docs work, and their errors come from
``saga_tasks.errors``, the one module with every error a user catches."""

from __future__ import annotations

import importlib
import re

from saga_tasks import errors
from tests.docs import all_text

IMPORT = re.compile(r"^from (saga_tasks[\w.]*) import ([\w, ]+)$", re.M)
ERROR_NAME = re.compile(
    r"`(?:saga_tasks\.errors\.)?([A-Z]\w+(?:Error|Rejection|Conflict|Overloaded|Refused|"
    r"Mismatch|NotFound|Payload|SagaType))`"
)


def _imports() -> list[tuple[str, str]]:
    blocks = re.findall(r"```python\n(.*?)```", all_text(), re.S)
    return [
        (module, name.strip())
        for block in blocks
        for module, names in IMPORT.findall(block)
        for name in names.split(",")
    ]


def test_every_name_the_docs_import_is_there():
    imports = _imports()
    assert ("saga_tasks", "Participant") in imports
    for module, name in imports:
        assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"


def test_the_docs_import_errors_from_saga_tasks_errors():
    for module, name in _imports():
        if isinstance(getattr(errors, name, None), type):
            assert module == "saga_tasks.errors", f"from {module} import {name}"


def test_every_error_the_docs_name_is_in_saga_tasks_errors():
    named = set(ERROR_NAME.findall(all_text()))
    assert {"SagaOverloaded", "ActionRefused", "VersionMismatch", "BusinessKeyConflict"} <= named
    for name in named:
        assert isinstance(getattr(errors, name, None), type), name
