"""Values from the outside made storable: PostgreSQL's ``text`` and ``jsonb`` refuse a NUL
character (and, through psycopg2, a lone surrogate), where AMQP headers and properties
carry any string. Records of messages that went wrong (held, invalid) take whatever a
broker delivered, so everything they store passes through here first.

The escape is visible, not silent: a NUL becomes the four characters ``\\x00``, a lone
surrogate its ``\\udcxx`` spelling, bytes that are not UTF-8 their ``\\xNN`` spelling.
Callers say so in the record's reason when anything was escaped (``escaped_keys``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any


def text(value: str) -> str:
    """``value`` with every character PostgreSQL cannot store written as an escape."""
    if value.isascii():
        return value.replace("\x00", "\\x00")
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def optional_text(value: Any) -> str | None:
    """``None`` stays ``None``; anything else becomes storable text."""
    return None if value is None else text(value if isinstance(value, str) else str(value))


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data (headers as a broker delivered them), not yet escaped:
    datetimes in ISO 8601, bytes decoded (``\\xNN`` for what is not UTF-8), anything
    else that JSON cannot hold as its string."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or infinity; jsonb refuses them
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def storable(value: Any) -> Any:
    """``plain(value)`` with every string, keys included, escaped by ``text``."""
    value = plain(value)
    if isinstance(value, dict):
        return {text(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, str):
        return text(value)
    return value


def escaped_keys(original: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The top-level keys of ``original`` whose stored form differs (escaped), sorted,
    themselves escaped."""
    changed = []
    for key, value in original.items():
        key_text = str(key)
        if text(key_text) != key_text or stored.get(text(key_text)) != plain(value):
            changed.append(text(key_text))
    return sorted(changed)
