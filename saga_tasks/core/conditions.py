"""Conditions on steps (``when=``): declarative predicates over the saga's payload and the
results of earlier steps.

A condition is data, not code: the decider evaluates it the same way on every replay,
``describe`` prints it, and two versions of a definition compare it by value. Paths are
dotted: ``payload.amount`` reads the payload, ``inspect.decision`` the result of step
``inspect``. A path that leads nowhere reads as None; a comparison of values that do not
compare (a string with a number, anything with None) is false, never an error. Values
compare as the JSON they are stored as: a bool is no number (``equals(path, 1)`` does not
hold for true), ``1`` equals ``1.0``, and only two numbers or two strings are ordered.

    step("refund", refund_task, when=equals("inspect.decision", "accepted"))
    step("expedite", ..., when=at_least("payload.amount", 100) & ~exists("payload.coupon"))
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from saga_tasks.core.documents import is_number, json_key, same_json

__all__ = [
    "Condition",
    "all_of",
    "any_of",
    "at_least",
    "at_most",
    "equals",
    "exists",
    "greater",
    "less",
    "negate",
    "not_equals",
    "one_of",
]

PAYLOAD = "payload"
"""The first segment of a path that reads the saga's payload."""

_MISSING = object()


class Condition:
    """A predicate over ``(payload, results)``; combine with ``&``, ``|`` and ``~``."""

    def holds(self, payload: Mapping[str, Any], results: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def paths(self) -> frozenset[str]:
        """Every path the condition reads."""
        raise NotImplementedError

    def __and__(self, other: Condition) -> Condition:
        return all_of(self, other)

    def __or__(self, other: Condition) -> Condition:
        return any_of(self, other)

    def __invert__(self) -> Condition:
        return negate(self)


def read(path: str, payload: Mapping[str, Any], results: Mapping[str, Any]) -> Any:
    """The value at ``path``, or None when any segment is missing."""
    head, *rest = path.split(".")
    value: Any = payload if head == PAYLOAD else results.get(head, _MISSING)
    for part in rest:
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            value = _MISSING
        if value is _MISSING:
            break
    return None if value is _MISSING else value


_ORDERS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True, eq=False)
class Compare(Condition):
    """``path op value``; ``exists`` has no value. Two compare equal when their values are
    one JSON value (``equals(p, 1)`` is not ``equals(p, True)``): versions compare by it."""

    path: str
    op: str
    value: Any = None

    def holds(self, payload: Mapping[str, Any], results: Mapping[str, Any]) -> bool:
        found = read(self.path, payload, results)
        if self.op == "exists":
            return found is not None
        if self.op == "==":
            return same_json(found, self.value)
        if self.op == "!=":
            return not same_json(found, self.value)
        if self.op == "in":
            return any(same_json(found, option) for option in self.value)
        ordered = (is_number(found) and is_number(self.value)) or (
            isinstance(found, str) and isinstance(self.value, str)
        )
        return ordered and _ORDERS[self.op](found, self.value)

    def paths(self) -> frozenset[str]:
        return frozenset({self.path})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Compare):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        return (self.path, self.op, json_key(self.value))

    def __str__(self) -> str:
        if self.op == "exists":
            return f"{self.path} exists"
        if self.op == "in":
            return f"{self.path} in [{', '.join(_shown(v) for v in self.value)}]"
        return f"{self.path} {self.op} {_shown(self.value)}"


@dataclass(frozen=True)
class AllOf(Condition):
    parts: tuple[Condition, ...]

    def holds(self, payload: Mapping[str, Any], results: Mapping[str, Any]) -> bool:
        return all(p.holds(payload, results) for p in self.parts)

    def paths(self) -> frozenset[str]:
        return frozenset().union(*(p.paths() for p in self.parts))

    def __str__(self) -> str:
        return " and ".join(_grouped(p) for p in self.parts)


@dataclass(frozen=True)
class AnyOf(Condition):
    parts: tuple[Condition, ...]

    def holds(self, payload: Mapping[str, Any], results: Mapping[str, Any]) -> bool:
        return any(p.holds(payload, results) for p in self.parts)

    def paths(self) -> frozenset[str]:
        return frozenset().union(*(p.paths() for p in self.parts))

    def __str__(self) -> str:
        return " or ".join(_grouped(p) for p in self.parts)


@dataclass(frozen=True)
class Not(Condition):
    part: Condition

    def holds(self, payload: Mapping[str, Any], results: Mapping[str, Any]) -> bool:
        return not self.part.holds(payload, results)

    def paths(self) -> frozenset[str]:
        return self.part.paths()

    def __str__(self) -> str:
        return f"not {_grouped(self.part)}"


def _shown(value: Any) -> str:
    """A value as a condition prints it: strings in single quotes, the rest as JSON."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return json.dumps(value)


def _grouped(c: Condition) -> str:
    return f"({c})" if isinstance(c, AllOf | AnyOf) else str(c)


def _path(path: str) -> str:
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        raise ValueError(f"a condition path is dotted words, like 'payload.amount': {path!r}")
    return path


def _scalar(value: Any) -> Any:
    if value is not None and not isinstance(value, str | int | float | bool):
        raise ValueError(f"a condition compares with a JSON scalar, not {type(value).__name__}")
    return value


def equals(path: str, value: Any) -> Condition:
    return Compare(_path(path), "==", _scalar(value))


def not_equals(path: str, value: Any) -> Condition:
    return Compare(_path(path), "!=", _scalar(value))


def _ordered(value: Any) -> Any:
    if not (is_number(value) or isinstance(value, str)):
        raise ValueError(
            f"an ordering compares with a number or a string, not {type(value).__name__}: "
            "JSON orders nothing else"
        )
    return value


def greater(path: str, value: float | str) -> Condition:
    return Compare(_path(path), ">", _ordered(value))


def at_least(path: str, value: float | str) -> Condition:
    return Compare(_path(path), ">=", _ordered(value))


def less(path: str, value: float | str) -> Condition:
    return Compare(_path(path), "<", _ordered(value))


def at_most(path: str, value: float | str) -> Condition:
    return Compare(_path(path), "<=", _ordered(value))


def one_of(path: str, values: Iterable[Any]) -> Condition:
    return Compare(_path(path), "in", tuple(_scalar(v) for v in values))


def exists(path: str) -> Condition:
    return Compare(_path(path), "exists")


def all_of(*parts: Condition) -> Condition:
    if not parts:
        raise ValueError("all_of needs at least one condition")
    return AllOf(tuple(parts))


def any_of(*parts: Condition) -> Condition:
    if not parts:
        raise ValueError("any_of needs at least one condition")
    return AnyOf(tuple(parts))


def negate(part: Condition) -> Condition:
    return Not(part)
