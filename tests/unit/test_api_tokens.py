"""Tokens with scopes (``SAGA_API_TOKENS``) and the gate that checks them: which caller
may read, operate or start, and what a refused one is told. Pure, no services."""

from __future__ import annotations

import pytest

from saga_tasks import Settings
from saga_tasks.config import API_SCOPES
from saga_tasks.errors import ConfigurationError
from saga_tasks.web.auth import OPERATE, READ, START, Caller, Forbidden, Gate, Unauthorized

T1 = "t1-0123456789abcdef"
T2 = "t2-0123456789abcdef"
T3 = "t3-0123456789abcdef"


def tokens(raw: str) -> dict[str, tuple[str, frozenset[str]]]:
    return Settings.from_env({}, api_tokens=raw).tokens()


def test_an_entry_names_its_scopes_and_one_without_has_them_all():
    assert tokens(f"ana:{T1}, viewer:{T2}:read ,ci: {T3} : start+read") == {
        T1: ("ana", API_SCOPES),
        T2: ("viewer", frozenset({"read"})),
        T3: ("ci", frozenset({"start", "read"})),
    }
    assert frozenset({"read", "operate", "start"}) == API_SCOPES
    assert tokens("") == {}


@pytest.mark.parametrize(
    "raw",
    [
        f"ana:{T1}:write",
        f"ana:{T1}:read+",
        f"ana:{T1}:",
        f"ana:{T1}:Read",
        f"ana:{T1}:read,operate",  # a comma starts the next entry, which has no token
    ],
)
def test_an_unknown_scope_names_the_actor_and_never_the_token(raw):
    with pytest.raises(ConfigurationError) as info:
        tokens(raw)
    assert T1 not in str(info.value)
    assert "'ana'" in str(info.value) or "actor:token" in str(info.value)


def test_a_token_with_a_colon_is_refused_without_quoting_its_pieces():
    with pytest.raises(ConfigurationError) as info:
        tokens("ana:first-half-0123456789:second-half-secret")
    said = str(info.value)
    assert "'ana'" in said and "first-half" not in said and "second-half" not in said


@pytest.mark.parametrize("raw", ["ana", f":{T1}", "ana:short", f"ana:{T1},bo"])
def test_malformed_entries_are_refused(raw):
    with pytest.raises(ConfigurationError, match="actor:token"):
        tokens(raw)


def test_repr_hides_the_tokens():
    assert T1 not in repr(Settings.from_env({}, api_tokens=f"ana:{T1}:read"))


GATE = Gate(
    {T1: ("ana", API_SCOPES), T2: ("viewer", frozenset({READ})), T3: ("ci", frozenset({START}))},
    public_read=False,
)


def test_the_gate_grants_a_scope_only_to_a_token_that_has_it():
    assert GATE.require(f"Bearer {T1}", OPERATE) == Caller("ana", API_SCOPES)
    assert GATE.require(f"bearer  {T2} ", READ).actor == "viewer"
    for header in (None, "", "Bearer ", f"Basic {T1}", T1):
        with pytest.raises(Unauthorized, match="needs a bearer token with the read scope"):
            GATE.require(header, READ)
    with pytest.raises(Unauthorized, match="unknown token"):
        GATE.require("Bearer t1-0123456789abcdeX", READ)
    with pytest.raises(Forbidden) as info:
        GATE.require(f"Bearer {T3}", READ)  # start does not imply read
    assert info.value.scope == READ and "'ci'" in str(info.value)
    with pytest.raises(Forbidden):
        GATE.require(f"Bearer {T2}", OPERATE)


def test_public_read_opens_reads_only_and_still_checks_a_token_it_is_sent():
    gate = Gate({T3: ("ci", frozenset({START, OPERATE}))}, public_read=True)
    assert gate.require(None, READ) == Caller(None, frozenset({READ}))
    assert gate.require(f"Bearer {T3}", READ) == Caller("ci", frozenset({READ, START, OPERATE}))
    with pytest.raises(Unauthorized):
        gate.require("Bearer nobody-has-this-token", READ)
    for scope in (OPERATE, START):
        with pytest.raises(Unauthorized):
            gate.require(None, scope)
