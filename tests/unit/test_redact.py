"""Masking what the HTTP API shows of held messages: field names matched by words, values
masked at any depth, and a held message as each scope sees it. Pure, no services."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_tasks import Settings
from saga_tasks.web.redact import MASK, field_names, held_view, mask, sensitive, words


@pytest.mark.parametrize(
    ("key", "hidden"),
    [
        ("password", True),
        ("PASSWORD", True),
        ("customer_email", True),
        ("emailAddress", True),
        ("billing-address", True),
        ("X-Api-Token", True),
        ("cardNumber", True),
        ("card_number", True),
        ("IBAN", True),
        ("api_key", True),
        ("apiKey", True),
        ("business_key", False),
        ("discarded", False),
        ("tokens_used_v2", False),
        ("saga_id", False),
        ("amount_cents", False),
    ],
)
def test_keys_match_by_words_in_any_spelling(key, hidden):
    names = field_names(Settings().redact_fields)
    assert sensitive(key, names) is hidden


def test_words_split_at_separators_case_and_digits():
    assert words("HTTPHeaderToken2x") == ("http", "header", "token", "2", "x")
    assert field_names(" card_number , ,CVV") == (("card", "number"), ("cvv",))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
NAMES = field_names("password,token,email,card_number")


def _walk(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_masking_leaves_no_listed_field_unmasked_and_changes_nothing_else(value):
    masked = mask(value, NAMES)
    assert all(v == MASK for k, v in _walk(masked) if sensitive(k, NAMES))
    assert mask(masked, NAMES) == masked  # idempotent
    assert mask(value, ()) == value  # no names: nothing masked
    assert json.loads(json.dumps(masked)) == masked  # still JSON


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["password", "Email", "note", "x"]), json_values))
def test_a_listed_value_never_survives_masking(value):
    secret = "s3cr3t-value-0001"
    planted = {**value, "password": secret, "nested": [{"userEmail": secret}]}
    assert secret not in json.dumps(mask(planted, NAMES))


def test_a_held_message_as_each_scope_sees_it():
    view = {
        "id": 3,
        "headers": {"task": "x.y", "kwargsrepr": "{'password': 'p'}", "auth-token": "t"},
        "body": json.dumps({"email": "e@x", "n": 1}),
        "replay_checks": [],
    }
    reader = held_view(view, body_shown=False, names=NAMES)
    assert reader["body"] is None and reader["body_redacted"] is True
    assert reader["headers"] == {"task": MASK, "kwargsrepr": MASK, "auth-token": MASK}
    operator = held_view(view, body_shown=True, names=NAMES)
    assert json.loads(operator["body"]) == {"email": MASK, "n": 1}
    assert operator["body_redacted"] is False
    assert operator["headers"] == {"task": "x.y", "kwargsrepr": MASK, "auth-token": MASK}
    for body in ("(base64) //79", "not json", None):
        shown = held_view({**view, "body": body}, body_shown=True, names=NAMES)
        assert shown["body"] is None and shown["body_redacted"] is (body is not None)
    assert view["body"] == json.dumps({"email": "e@x", "n": 1})  # the input is not changed
