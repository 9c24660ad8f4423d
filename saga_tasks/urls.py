"""URLs in messages: a password never shows. ``mask_url`` for a URL one names,
``scrub`` for a driver's error that may quote pieces of it, ``malformed`` for credentials
a parser would misread. Pure (the standard library only), so errors and the core may use it.
"""

from __future__ import annotations

import re

__all__ = ["malformed", "mask_url", "scrub"]


_MUST_ENCODE = re.compile(r"[/#?@\[\]\s]|%(?![0-9A-Fa-f]{2})")
"""What a URL's user or password must not hold raw: each parser (libpq, SQLAlchemy, kombu,
urllib) reads it otherwise, and quotes the pieces it misread in its errors."""
_PIECE = re.compile(r"[^/#?@:\s]+")
"""A piece of a password written raw: where a parser may cut it, it ends."""


def _parts(url: str) -> tuple[str, str | None, str] | None:
    """(scheme, credentials or None, the rest) of ``url``, read by hand; None if it is not
    ``scheme://...``. The credentials are everything between ``://`` and the last ``@``
    (a raw ``/``, ``#``, ``?`` or ``@`` in a password does not end them early)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    at = rest.rfind("@")
    if at < 0:
        return scheme, None, rest
    return scheme, rest[:at], rest[at + 1 :]


def _bad_port(location: str) -> bool:
    """Whether the port of ``host[:port][/...]`` is written but is not a number."""
    hostport = re.split(r"[/?#]", location, maxsplit=1)[0]
    if hostport.startswith("["):
        _host, _bracket, after = hostport.partition("]")
        port = after[1:] if after.startswith(":") else ""
    else:
        port = hostport.rpartition(":")[2] if ":" in hostport else ""
    return bool(port) and not port.isdigit()


def malformed(url: str) -> str | None:
    """Why ``url`` cannot be read the same by every parser (what to do about it, without a
    piece of it); None if it can."""
    parts = _parts(url)
    if parts is None:
        return None
    _scheme, credentials, location = parts
    if credentials is not None and _MUST_ENCODE.search(credentials):
        return (
            "its user or password holds a raw / # ? @ [ ] % or space; percent-encode it "
            "(%2F %23 %3F %40 %5B %5D %25 %20)"
        )
    if _bad_port(location):
        return "its port is not a number (a password with a raw / # or ? ends where it should not)"
    return None


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***``, safe for logs and error messages.

    Read by hand, not by ``urlsplit``: an unencoded ``/``, ``#`` or ``?`` in a password
    would end the netloc early and leave the password in the "path". Everything between
    the scheme and the last ``@`` is credentials; of well-formed ones the part after the
    first ``:`` is masked, of malformed ones (``malformed``) all of them; and a URL whose
    port is no number (a password cut short, no ``@`` left) shows its scheme only.
    """
    parts = _parts(url)
    if parts is None:
        return "<not a url>" if "@" in url else url
    scheme, credentials, location = parts
    if _bad_port(location):
        return f"{scheme}://***" if credentials is None else f"{scheme}://***@{location}"
    if credentials is None:
        return url
    if _MUST_ENCODE.search(credentials):
        return f"{scheme}://***@{location}"
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{location}"


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error, say) with the URL's password, each piece of it and each
    run of pieces taken out: a library that misreads an unencoded ``/``, ``#``, ``?``,
    ``@``, ``:`` or space quotes a fragment (of malformed credentials, the user's part
    too: where it ends is not sure)."""
    parts = _parts(url)
    credentials = parts[1] if parts is not None else None
    if not credentials:
        return text
    _user, _colon, password = credentials.partition(":")
    secret = credentials if _MUST_ENCODE.search(credentials) else password
    pieces = [m.span() for m in _PIECE.finditer(secret)]
    runs = {secret[a:b] for i, (a, _) in enumerate(pieces) for _, b in pieces[i:]}
    for run in sorted(runs, key=len, reverse=True):
        if len(run) >= 2:
            text = text.replace(run, "***")
    return text
