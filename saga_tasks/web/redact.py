"""Masking what the HTTP API shows of messages: values under sensitive field names, at any
depth, and whole held messages for callers who may not see their bodies.

A key matches a name of ``SAGA_REDACT_FIELDS`` when the name's words appear, in order and
next to each other, among the key's words (``customer_email``, ``billingAddress`` and
``X-Api-Token`` match ``email``, ``address`` and ``token``; ``discarded`` does not match
``card``). Matching words, not substrings, masks the usual spellings of a field without
masking unrelated ones; a near miss is masked rather than shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

MASK = "***"
BODY_COPIES = frozenset({"argsrepr", "kwargsrepr"})
"""Celery headers that quote the body as a Python repr: no field in them can be masked, so
their values are masked whole, as an unparsable body is withheld whole."""
_UNPARSED = object()

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

Names = tuple[tuple[str, ...], ...]


def words(key: str) -> tuple[str, ...]:
    """``key`` split into lower-case words at separators, camelCase and digits."""
    return tuple(w.lower() for w in _WORD.findall(key))


def field_names(raw: str | Iterable[str]) -> Names:
    """``SAGA_REDACT_FIELDS`` (comma-separated, or already split) as word sequences."""
    parts = raw.split(",") if isinstance(raw, str) else raw
    return tuple(dict.fromkeys(w for w in (words(p) for p in parts) if w))


def sensitive(key: str, names: Names) -> bool:
    """Whether ``key`` names a field of ``names``."""
    found = words(key)
    return any(
        found[i : i + len(name)] == name
        for name in names
        for i in range(len(found) - len(name) + 1)
    )


def mask(value: Any, names: Names) -> Any:
    """``value`` with the value of every mapping key that names a sensitive field replaced
    by ``***``, in mappings and lists at any depth; everything else as it was."""
    if isinstance(value, dict):
        return {k: MASK if sensitive(str(k), names) else mask(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v, names) for v in value]
    return value


def held_view(view: dict[str, Any], *, body_shown: bool, names: Names) -> dict[str, Any]:
    """A held message as a caller may see it.

    With ``body_shown`` (the ``operate`` scope): headers and a JSON body with sensitive
    fields masked; a body that is not JSON (base64, text) cannot be masked field by
    field, so it is withheld like any body of a ``read`` caller (as are the headers that
    quote the body, ``BODY_COPIES``). Without it: every header
    value masked (Celery's ``kwargsrepr`` header may quote a payload) and no body.
    ``body_redacted`` says whether the body was withheld.
    """
    shown = dict(view)
    headers = view.get("headers") or {}
    body = view.get("body")
    if not body_shown:
        shown["headers"] = dict.fromkeys(headers, MASK)
        shown["body"] = None
        shown["body_redacted"] = body is not None
        return shown
    shown["headers"] = {
        k: MASK if k.lower() in BODY_COPIES else v for k, v in mask(headers, names).items()
    }
    try:
        parsed = json.loads(body) if isinstance(body, str) else _UNPARSED
    except ValueError:
        parsed = _UNPARSED
    if parsed is _UNPARSED:
        shown["body"] = None
        shown["body_redacted"] = body is not None
    else:
        shown["body"] = json.dumps(mask(parsed, names), ensure_ascii=False)
        shown["body_redacted"] = False
    return shown
