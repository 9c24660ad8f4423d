"""The public surface is pinned, and the pure core imports no infrastructure."""

from __future__ import annotations

import ast
from pathlib import Path

import saga_tasks

PACKAGE = Path(saga_tasks.__file__).parent
PURE_CORE = [
    "core/clock", "core/definitions", "core/states", "core/model", "core/events",
    "core/decider", "core/messages", "errors",
]  # fmt: skip
BANNED = ("celery", "kombu", "amqp", "sqlalchemy", "psycopg2", "redis")


def test_public_api_is_pinned():
    assert sorted(saga_tasks.__all__) == sorted(
        [
            "LateReplyPolicy", "RetryPolicy", "SagaDefinition", "Step", "saga", "step",
            "BusinessRejection", "CommandContext", "Participant", "TransientError",
            "SagaApp", "SagaHandle", "Settings", "default_app", "load_app", "start_saga",
            "CommandIntent", "Decision", "HistoryEntry", "ReplyReceived", "SagaState",
            "SagaStatus", "Started", "StepState", "StepStatus", "decide",
            "BusinessKeyConflict", "ConfigurationError", "CrossParticipantCompensation",
            "DefinitionError", "DependencyCycle",
            "DuplicateStep", "InputError", "InvalidMessage", "InvalidPayload", "MissingQueue",
            "SagaNotFound", "SagaTasksError", "ServiceUnavailable", "UnknownDependency",
            "UnknownSagaType",
        ]
    )  # fmt: skip
    for name in saga_tasks.__all__:
        assert hasattr(saga_tasks, name)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_pure_core_imports_no_infrastructure():
    for module in PURE_CORE:
        imports = _imports(PACKAGE / f"{module}.py")
        bad = {i for i in imports if i.split(".")[0] in BANNED}
        assert not bad, f"saga_tasks.{module} imports {bad}"
        inner = {i for i in imports if i.startswith("saga_tasks.")}
        assert all(i.removeprefix("saga_tasks.").replace(".", "/") in PURE_CORE for i in inner), (
            f"saga_tasks.{module} reaches outside the pure core: {inner}"
        )


def test_only_persistence_speaks_sql_and_only_messaging_speaks_amqp():
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        imports = _imports(path)
        if any(i.startswith("kombu") or i.startswith("amqp") for i in imports):
            assert rel.startswith(("messaging/", "worker/", "ops/", "testing/")), rel


def test_neither_the_library_nor_the_example_imports_the_tools():
    root = PACKAGE.parent
    for tree in (PACKAGE, root / "participants"):
        for path in tree.rglob("*.py"):
            tools = {i for i in _imports(path) if i.split(".")[0] == "tools"}
            assert not tools, f"{path.relative_to(root)} imports {tools}"
