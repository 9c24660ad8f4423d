"""Who calls the HTTP API and what they may do.

A bearer token of ``SAGA_API_TOKENS`` names an actor (the history records what it does)
and its scopes: ``read`` (sagas, histories, lists, held messages without their bodies),
``operate`` (operator actions; held bodies, masked) and ``start`` (starting sagas). No
scope implies another: a service that starts sagas and polls their status needs
``start+read``. With ``SAGA_API_PUBLIC_READ`` a request without a token reads as an
anonymous ``read`` caller; a token it does send is still checked, so a wrong one is
told so.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

READ, OPERATE, START = "read", "operate", "start"


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: ``actor`` None for an anonymous public reader."""

    actor: str | None
    scopes: frozenset[str]

    @property
    def name(self) -> str:
        """The actor for a history or an audit line; only token holders may act."""
        return self.actor or "(public read)"


class Unauthorized(Exception):
    """No bearer token where one is needed, or one that no entry names (401)."""


class Forbidden(Exception):
    """A known token without the scope the route needs (403)."""

    def __init__(self, actor: str | None, scope: str) -> None:
        super().__init__(f"the token of {actor!r} lacks the {scope} scope")
        self.actor = actor
        self.scope = scope


class Gate:
    """Checks a request's ``Authorization`` header against the configured tokens."""

    def __init__(
        self, tokens: Mapping[str, tuple[str, frozenset[str]]], *, public_read: bool
    ) -> None:
        self._tokens = dict(tokens)
        self.public_read = public_read

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller a bearer token names; None without one; Unauthorized for a token
        no entry has. Each comparison takes the same time, wherever the tokens differ."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        for known, (actor, scopes) in self._tokens.items():
            if secrets.compare_digest(known.encode(), token.encode()):
                return Caller(actor, scopes)
        raise Unauthorized("unknown token")

    def reads(self, caller: Caller) -> bool:
        """Whether ``caller`` may read sagas (its token's scope, or public read)."""
        return READ in caller.scopes or self.public_read

    def require(self, authorization: str | None, scope: str) -> Caller:
        """The caller, if it may use ``scope``; Unauthorized or Forbidden if not."""
        caller = self.identify(authorization)
        if scope == READ and self.public_read:
            if caller is None:
                return Caller(None, frozenset({READ}))
            return Caller(caller.actor, caller.scopes | {READ})
        if caller is None:
            raise Unauthorized(f"this needs a bearer token with the {scope} scope")
        if scope not in caller.scopes:
            raise Forbidden(caller.actor, scope)
        return caller
