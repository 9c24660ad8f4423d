"""Golden histories: a saga's recorded run (each event, when, and what was decided) kept as
JSON beside a test and replayed against the definition, so a change of behaviour, in a
definition or in a release of saga_tasks, shows as a diff a person reads and accepts.

    d = SagaDriver(TRIP, payload={"guest_ref": "g-1"})
    d.start(); d.succeed("hotel"); d.fail("flight", "sold_out"); d.compensated("hotel")
    golden.check(d, Path(__file__).with_name("trip_sold_out.json"))

``check`` compares the driver's run with the file. A missing file is written and the test
fails once, saying so (a test that passes on the run that wrote its own expectation could
never fail); ``SAGA_GOLDEN_UPDATE=1`` rewrites files that differ after a change is accepted.
``replay(definition, path)`` replays a file's events alone, for files kept without the test
that drove them.

What is compared is what a saga does, not how the state is stored: per event, the saga's
status, each step's status, error, attempts and deadline, the commands sent (task, queue,
ids, body) and the history lines. Times are seconds after the saga was created.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from saga_tasks.core import events
from saga_tasks.core.decider import Decision, decide
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.model import SagaState
from saga_tasks.testing.driver import SagaDriver

__all__ = ["UPDATE", "GoldenMismatch", "check", "record", "replay"]

FORMAT = 1
UPDATE = "SAGA_GOLDEN_UPDATE"
"""Set to 1 to rewrite golden files that differ (after reading the diff)."""

_EVENTS: dict[str, type] = {
    cls.__name__: cls
    for cls in vars(events).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == events.__name__
}


class GoldenMismatch(AssertionError):
    """The run differs from its golden file; the message is the unified diff."""


def record(driver: SagaDriver) -> dict[str, Any]:
    """The driver's run as a golden document: how the saga began, then each event with
    when it came and what the decider made of it."""
    return {
        "format": FORMAT,
        "saga": driver.definition.saga_type,
        "definition_version": driver.definition.version,
        "begin": _begin(driver.initial),
        "turns": [
            {
                "at": _seconds(at, driver.initial.created_at),
                "event": _encode_event(event),
                "decision": _render(decision, driver.initial.created_at),
            }
            for (at, event), decision in zip(driver.events, driver.decisions, strict=True)
        ],
    }


def replay(definition: SagaDefinition, path: Path | str) -> dict[str, Any]:
    """Decide a golden file's events again against ``definition``; return the document the
    run makes now (equal to the file's when nothing changed). ``GoldenMismatch`` when the
    file's saga is another type."""
    return _replayed(definition, _load(Path(path)), Path(path))


def _replayed(definition: SagaDefinition, recorded: dict[str, Any], path: Path) -> dict[str, Any]:
    if recorded["saga"] != definition.saga_type:
        raise GoldenMismatch(
            f"{path} records a {recorded['saga']!r} saga, not {definition.saga_type!r}"
        )
    begin = recorded["begin"]
    created = datetime.fromisoformat(begin["created_at"])
    state = SagaState.new(
        definition,
        saga_id=begin["saga_id"],
        business_key=begin["business_key"],
        payload=begin["payload"],
        now=created,
        id_key=begin["id_key"],
    )
    turns = []
    for turn in recorded["turns"]:
        decision = decide(
            definition, state, _decode_event(turn["event"]), created + timedelta(seconds=turn["at"])
        )
        state = decision.state
        turns.append(
            {"at": turn["at"], "event": turn["event"], "decision": _render(decision, created)}
        )
    return {**recorded, "definition_version": definition.version, "turns": turns}


def check(driver: SagaDriver, path: Path | str) -> None:
    """Compare the driver's run with the golden file at ``path`` and replay the file's
    events against the driver's definition; ``GoldenMismatch`` with the diff if either
    differs. A missing file is written and fails the test once; ``SAGA_GOLDEN_UPDATE=1``
    rewrites a file that differs."""
    path = Path(path)
    now = record(driver)
    update = os.environ.get(UPDATE, "") not in ("", "0")
    if not path.exists():
        _write(path, now)
        if not update:
            raise GoldenMismatch(
                f"{path} did not exist: it is written now; read it, commit it, run again"
            )
        return
    was = _load(path)
    expected, ran, replayed = (
        _dump(d) for d in (was, now, _replayed(driver.definition, was, path))
    )
    if expected == ran == replayed:
        return
    if update:
        _write(path, now)
        return
    parts = []
    if replayed != expected:
        parts.append(_diff(expected, replayed, path, "its events decided now"))
    if ran != expected:
        parts.append(_diff(expected, ran, path, "the test's run"))
    raise GoldenMismatch("\n".join(parts) + f"\nif the change is meant, {UPDATE}=1 rewrites {path}")


def _begin(state: SagaState) -> dict[str, Any]:
    return {
        "saga_id": state.saga_id,
        "business_key": state.business_key,
        "payload": dict(state.payload),
        "created_at": state.created_at.isoformat(),
        "id_key": state.id_key,
    }


def _render(decision: Decision, created: datetime) -> dict[str, Any]:
    state = decision.state

    def when(at: datetime | None) -> float | None:
        return None if at is None else _seconds(at, created)

    return {
        "classification": decision.classification.value,
        "changed": decision.changed,
        "status": state.status.value,
        "deadline": when(state.deadline),
        "reason": state.reason,
        "steps": {
            name: {
                "status": st.status.value,
                "error": st.error,
                "attempt": st.attempt,
                "compensation_attempt": st.compensation_attempt,
                "generation": st.generation,
                "deadline": when(st.deadline),
            }
            for name, st in state.steps.items()
        },
        "sent": [
            {
                "step": c.step,
                "kind": c.kind.value,
                "task": c.task_name,
                "queue": c.queue,
                "command_id": c.command_id,
                "attempt": c.attempt,
                "compensates": c.compensates,
                "body": _plain(c.body),
            }
            for c in decision.commands
        ],
        "history": [
            {
                "event": h.event,
                "step": h.step,
                "saga": _transition(h.saga_status_before, h.saga_status_after),
                "step_status": _transition(h.step_status_before, h.step_status_after),
                "reason": h.reason,
            }
            for h in decision.history
        ],
    }


def _transition(before: enum.Enum | None, after: enum.Enum | None) -> str | None:
    if after is None:
        return None
    return after.value if before is None or before == after else f"{before.value} -> {after.value}"


def _encode_event(event: Any) -> dict[str, Any]:
    fields = {f.name: _plain(getattr(event, f.name)) for f in dataclasses.fields(event)}
    return {"type": type(event).__name__, **fields}


def _decode_event(document: Mapping[str, Any]) -> Any:
    cls = _EVENTS.get(document.get("type", ""))
    if cls is None:
        raise GoldenMismatch(f"unknown event type {document.get('type')!r} in a golden file")
    hints = typing.get_type_hints(cls)
    values = {k: _typed(hints[k], v) for k, v in document.items() if k != "type"}
    return cls(**values)


def _typed(hint: Any, value: Any) -> Any:
    """``value`` read from JSON as the field's type says: enums, datetimes, and the
    mappings, tuples and optionals of them."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _typed(options[0], value) if len(options) == 1 else value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if hint is datetime:
        return datetime.fromisoformat(value)
    if origin in (Mapping, dict) and isinstance(value, dict):
        inner = typing.get_args(hint)[1] if typing.get_args(hint) else Any
        return {k: _typed(inner, v) for k, v in value.items()}
    if origin in (tuple, Sequence) and isinstance(value, list):
        args = typing.get_args(hint)
        return tuple(_typed(args[0] if args else Any, v) for v in value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _seconds(at: datetime, created: datetime) -> float:
    return round((at - created).total_seconds(), 6)


def _dump(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _write(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(document), encoding="utf-8")


def _load(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise GoldenMismatch(f"{path} is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise GoldenMismatch(f"{path} is not a golden history of format {FORMAT}")
    return document


def _diff(was: str, now: str, path: Path, what: str) -> str:
    lines = difflib.unified_diff(
        was.splitlines(keepends=True),
        now.splitlines(keepends=True),
        fromfile=str(path),
        tofile=what,
    )
    return "".join(lines)
