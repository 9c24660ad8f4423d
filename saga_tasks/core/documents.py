"""JSON documents as a saga keeps them: what a validator returned, made into the document
that is stored, and two values compared as JSON compares them.

Payloads, step results and a person's decisions are stored as JSON and read back as
JSON, so every comparison the decider makes (a condition, a repeated signal) must give
the answer it would give on the stored document: a bool is no number (Python's
``True == 1`` is not JSON's), numbers are equal by value (``1`` and ``1.0``), arrays and
objects member by member.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["NotJson", "is_number", "json_document", "json_key", "same_json"]


class NotJson(TypeError):
    """A value has no one JSON form: ``where`` says which member (a dotted path, ``[i]``
    for an array's), ``kind`` what it is."""

    def __init__(self, where: str, kind: str) -> None:
        super().__init__(f"{where or 'the document'} is a {kind}, which is not a JSON value")
        self.where = where
        self.kind = kind


def json_document(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as the JSON object it is stored as, or ``NotJson`` naming the first
    member that has no one JSON form. Tuples become arrays; anything else that JSON does
    not have (a datetime, a Decimal, a set, bytes, a key that is no string, NaN) is
    refused rather than guessed at: read back, it would not be what was compared."""
    document = _member(value, "")
    assert isinstance(document, dict)
    return document


def _member(value: Any, where: str) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJson(where, "float that is not finite")
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, member in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if not isinstance(key, str):
                raise NotJson(f"the key {inner}", f"{type(key).__name__}, not a string")
            out[key] = _member(member, inner)
        return out
    if isinstance(value, list | tuple):
        return [_member(m, f"{where}[{i}]") for i, m in enumerate(value)]
    raise NotJson(where, type(value).__name__)


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one JSON value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_number(a) and is_number(b):
        return bool(a == b)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return a is None and b is None


def is_number(value: Any) -> bool:
    """A JSON number: an int or a float, never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_key(value: Any) -> Any:
    """A key equal (and hashed alike) for two scalars, or tuples of them, exactly when
    ``same_json`` holds: what a frozen value holding them compares by."""
    if isinstance(value, tuple):
        return tuple(json_key(v) for v in value)
    if isinstance(value, bool):
        return ("bool", value)
    return (type(value).__name__ if not is_number(value) else "number", value)
