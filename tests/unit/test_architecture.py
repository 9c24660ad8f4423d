"""The shape of the house, checked: the public surface is pinned, the import graph has
no cycle, and each layer speaks only its own language.

- ``core/`` is pure: it imports nothing outside ``saga_tasks.core`` and
  ``saga_tasks.errors``, and no infrastructure library.
- SQL (statements, not the ``Engine``/``Connection`` types passed around) is built only
  in ``persistence/``.
- AMQP (kombu, amqp) is spoken only in ``messaging/``; Celery only there and in
  ``worker/``, plus the composition root that builds the Celery app.
- Nothing below the composition root (``app.py``) imports it; only the edges
  (``ops/``, ``web/``, ``testing/``) and the package's own ``__init__`` may.
- No module imports the example (``participants``) or the tools.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import saga_tasks

PACKAGE = Path(saga_tasks.__file__).parent
INFRASTRUCTURE = ("celery", "kombu", "amqp", "sqlalchemy", "psycopg2", "redis", "fastapi")
SQL_TYPES = {
    "Connection",
    "Engine",
    "Table",
    "MetaData",
    "Column",
    "exc",
    "event",
    "URL",
    "make_url",
}
"""What may be imported from sqlalchemy outside persistence: types to pass along, errors."""
EDGES = ("ops/", "web/", "testing/", "__init__.py")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of every import in the file, at any depth, relative ones resolved."""
    module = next(m for m, p in MODULES.items() if p == path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            yield base, [a.name for a in node.names]


def _internal_targets(path: Path) -> set[str]:
    targets = set()
    for module, names in _imports(path):
        for name in names:
            if f"{module}.{name}" in MODULES:
                targets.add(f"{module}.{name}")
                break
        else:
            if module in MODULES:
                targets.add(module)
    return targets


def _rel(module: str) -> str:
    return MODULES[module].relative_to(PACKAGE).as_posix()


def test_public_api_is_pinned():
    """The exact public face, in its order (grouped by concern): a change shows here."""
    assert saga_tasks.__all__ == [
        "RetryPolicy", "SagaDefinition", "Step", "human_step", "saga", "step",
        "Condition", "all_of", "any_of", "at_least", "at_most", "equals", "exists",
        "greater", "less", "negate", "not_equals", "one_of",
        "Schedule", "schedule",
        "CommandContext", "Participant",
        "SagaApp", "start_saga", "SagaHandle", "SagaStatus", "Settings",
        "errors",
    ]  # fmt: skip
    for name in saga_tasks.__all__:
        assert hasattr(saga_tasks, name)


def test_importing_the_package_loads_none_of_its_names():
    """Each name loads on first use: ``import saga_tasks`` pays for nothing behind it."""
    code = (
        "import sys, saga_tasks; "
        "print(sorted(m for m in sys.modules if m.startswith('saga_tasks.') "
        "or m.split('.')[0] in ('celery', 'kombu', 'sqlalchemy', 'pydantic')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_stub_types_exactly_what_the_package_exports():
    """Type checkers read ``__init__.pyi``; every name there re-exported (``X as X``)."""
    stub = ast.parse((PACKAGE / "__init__.pyi").read_text())
    names = [
        alias.name
        for node in stub.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    ]
    assert names == saga_tasks.__all__
    assert all(isinstance(node, ast.ImportFrom | ast.Expr) for node in stub.body)


def test_the_import_graph_has_no_cycle():
    """Every import counts, lazy ones and those under TYPE_CHECKING too: a cycle hidden in a
    function is still a cycle in the design."""
    graph = {}
    for module, path in MODULES.items():
        targets = _internal_targets(path) - {module}
        if path.name == "__init__.py":  # re-exporting its own submodules is what it is for
            targets = {t for t in targets if not t.startswith(module + ".")}
        graph[module] = targets
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_core_is_pure():
    core = [m for m in MODULES if m.startswith("saga_tasks.core")]
    assert len(core) >= 8, core
    for module in core:
        for imported, _ in _imports(MODULES[module]):
            root = imported.split(".")[0]
            assert root not in INFRASTRUCTURE, f"{module} imports {imported}"
            if root == "saga_tasks":
                assert imported.startswith(("saga_tasks.core", "saga_tasks.errors")), (
                    f"{module} reaches outside the core: {imported}"
                )


def test_only_persistence_builds_sql():
    for module, path in MODULES.items():
        if _rel(module).startswith("persistence/"):
            continue
        for imported, names in _imports(path):
            if imported.split(".")[0] != "sqlalchemy":
                continue
            extra = (
                set(names) - SQL_TYPES if imported in ("sqlalchemy", "sqlalchemy.engine") else set()
            )
            allowed = imported in (
                "sqlalchemy",
                "sqlalchemy.engine",
                "sqlalchemy.orm",
                "sqlalchemy.exc",
            )
            assert allowed and not extra, (
                f"{_rel(module)} builds SQL: from {imported} import {names}"
            )


def test_only_messaging_speaks_amqp_and_only_the_wiring_celery():
    for module, path in MODULES.items():
        rel = _rel(module)
        for imported, _ in _imports(path):
            root = imported.split(".")[0]
            if root in ("kombu", "amqp"):
                assert rel.startswith("messaging/"), f"{rel} speaks AMQP ({imported})"
            if root == "celery":
                assert rel.startswith(("messaging/", "worker/")) or rel == "app.py", (
                    f"{rel} imports Celery ({imported})"
                )


def test_nothing_below_the_composition_root_imports_it():
    for module, path in MODULES.items():
        rel = _rel(module)
        if rel == "app.py" or rel.startswith(EDGES):
            continue
        assert "saga_tasks.app" not in _internal_targets(path), f"{rel} imports saga_tasks.app"


def test_the_library_knows_neither_the_example_nor_the_tools():
    for module, path in MODULES.items():
        for imported, _ in _imports(path):
            assert imported.split(".")[0] not in ("participants", "tools"), (
                f"{_rel(module)} imports {imported}"
            )


def test_the_example_does_not_import_the_tools():
    """The example depends on the library; the tools on both; never the other way."""
    example = PACKAGE.parent / "participants"
    for path in example.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.split(".")[0] == "tools"], path.name


def test_the_web_edge_stands_on_ops_and_ops_never_on_the_web():
    """``web`` reads through ``ops`` (views, operator actions); an import the other way
    would make every CLI command and worker carry the web stack. The ``web`` command is
    found by name (``ops.cli.plugins.EDGES``), not imported."""
    upward = sorted(
        f"{_rel(m)} -> {_rel(t)}"
        for m, path in MODULES.items()
        if m.startswith("saga_tasks.ops")
        for t in _internal_targets(path)
        if t.startswith("saga_tasks.web")
    )
    assert upward == []
    from saga_tasks.ops.cli.plugins import EDGES, edge

    for name in EDGES:
        entry = edge(name)
        assert entry is not None and entry.load().name == name
