"""saga_tasks: saga orchestration for Celery, RabbitMQ as transport, PostgreSQL as the truth.

The public names are listed once, in ``__init__.pyi``, for type checkers and for this
module alike: each is loaded from its module on first use (PEP 562), so ``import
saga_tasks.ops.cli`` or a participant's module pays for what it uses, not for Celery,
kombu and the web stack, and an operator's read command answers quickly.
"""

import ast
import importlib
from pathlib import Path
from typing import Any


def _public() -> dict[str, str]:
    """Each public name and the module it comes from, read from the stub's imports."""
    stub = ast.parse(Path(__file__).with_name("__init__.pyi").read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name: node.module
        for node in stub.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_WHERE = _public()
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'saga_tasks' has no attribute {name!r}")
    if module == __name__:  # a submodule: saga_tasks.errors
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
