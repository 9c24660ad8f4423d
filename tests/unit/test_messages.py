"""Reading messages back: every malformed one is an ``InvalidMessage`` with a reason."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from saga_tasks.core.messages import (
    command_headers,
    parse_command,
    parse_reply,
    reply_message,
)
from saga_tasks.core.states import MessageKind, Outcome
from saga_tasks.errors import InvalidMessage

SAGA = str(uuid.uuid4())
CMD = str(uuid.uuid4())


def headers(**over):
    h = command_headers(
        saga_id=SAGA,
        saga_type="order",
        step="reserve",
        kind=MessageKind.COMMAND,
        command_id=CMD,
        attempt=1,
        correlation_id=SAGA,
        causation_id=None,
        compensates=None,
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
    h.update(over)
    return {k: v for k, v in h.items() if v is not None}


def test_command_round_trip_and_reply_built_from_it():
    cmd = parse_command("m1", headers(), {"saga_payload": {"a": 1}, "results": {}})
    assert (cmd.saga_id, cmd.step, cmd.kind, cmd.command_id) == (
        SAGA,
        "reserve",
        MessageKind.COMMAND,
        CMD,
    )
    reply = reply_message(
        cmd, reply_id="r1", reply_queue="saga.replies", outcome=Outcome.SUCCESS, result={"x": 1}
    )
    saga_id, event = parse_reply(reply.message_id, reply.headers, reply.body)
    assert saga_id == SAGA
    assert (event.step, event.kind, event.command_id, event.outcome) == (
        "reserve",
        MessageKind.COMMAND,
        CMD,
        Outcome.SUCCESS,
    )
    assert event.result == {"x": 1}
    assert reply.headers["saga_causation_id"] == "m1"
    assert reply.headers["traceparent"] == headers()["traceparent"]


def test_failure_reply_carries_code_and_message():
    cmd = parse_command("m1", headers(), {})
    reply = reply_message(
        cmd,
        reply_id="r",
        reply_queue="q",
        outcome=Outcome.FAILURE,
        error_code="declined",
        error_message="limit",
    )
    _, event = parse_reply("r", reply.headers, reply.body)
    assert (event.error_code, event.error_message) == ("declined", "limit")


@pytest.mark.parametrize(
    ("hdrs", "body", "reason"),
    [
        ({}, {}, "missing or empty header 'saga_id'"),
        (headers(saga_id="nope"), {}, "not a UUID"),
        (headers(saga_message_kind="reply"), {}, "sent to a command queue"),
        (headers(saga_message_kind="bogus"), {}, "unknown message kind"),
        (headers(saga_command_id="x"), {}, "saga_command_id"),
        (headers(saga_attempt=0), {}, "positive integer"),
        (headers(), [1, 2], "JSON object"),
        (headers(), {"saga_payload": 3}, "objects"),
    ],
)
def test_bad_commands(hdrs, body, reason):
    with pytest.raises(InvalidMessage, match=reason):
        parse_command("m", hdrs, body)


def _reply_headers(**over):
    h = {
        "saga_id": SAGA,
        "saga_step": "reserve",
        "saga_message_kind": "reply",
        "saga_reply_to_kind": "command",
        "saga_command_id": CMD,
    }
    h.update(over)
    return h


@pytest.mark.parametrize(
    ("hdrs", "body", "reason"),
    [
        (None, {"outcome": "success"}, "saga_id"),
        (_reply_headers(saga_message_kind="command"), {"outcome": "success"}, "expected a reply"),
        (_reply_headers(saga_reply_to_kind="x"), {"outcome": "success"}, "saga_reply_to_kind"),
        (_reply_headers(), {"outcome": "maybe"}, "'success' or 'failure'"),
        (_reply_headers(), {}, "'success' or 'failure'"),
        (_reply_headers(), "text", "JSON object"),
        (_reply_headers(), {"outcome": "success", "result": 3}, "'result'"),
        (_reply_headers(), {"outcome": "failure", "error": "x"}, "'error'"),
        (_reply_headers(saga_step=""), {"outcome": "success"}, "saga_step"),
    ],
)
def test_bad_replies(hdrs, body, reason):
    with pytest.raises(InvalidMessage, match=reason):
        parse_reply("m", hdrs, body)


@given(
    st.dictionaries(
        st.text(max_size=20), st.one_of(st.none(), st.integers(), st.text(max_size=40)), max_size=8
    ),
    st.one_of(
        st.none(),
        st.integers(),
        st.text(),
        st.dictionaries(st.text(max_size=10), st.text(max_size=10)),
    ),
)
def test_any_garbage_is_refused_with_a_reason_never_a_crash(hdrs, body):
    for parse in (parse_command, parse_reply):
        try:
            parse("m", hdrs, body)
        except InvalidMessage as exc:
            assert exc.reason


def test_ids_are_keyed_by_the_sagas_secret_not_derivable_from_its_public_id():
    """Knowing a saga id is not enough to answer for its steps: the ids a participant
    deduplicates on are derived with the saga's own key; the same key makes the same ids
    (deciding twice after a crash), another key others. A saga started before ids were
    keyed (no key) keeps its old ids."""
    from datetime import UTC, datetime

    from saga_tasks.core.definitions import saga, step
    from saga_tasks.core.model import SagaState, command_id, message_id, new_id_key
    from saga_tasks.core.states import MessageKind

    definition = saga("one", step("s0", "p.do", queue="p.commands", timeout=5))
    now = datetime.now(UTC)

    def state(key):
        return SagaState.new(
            definition, saga_id="0f" * 16, business_key="k", payload={}, now=now, id_key=key
        )

    key = new_id_key()
    assert len(key) == 32 and key != new_id_key()
    keyed, same, other, legacy = state(key), state(key), state(new_id_key()), state(None)
    cid = command_id(keyed, "s0", MessageKind.COMMAND, 1)
    assert cid == command_id(same, "s0", MessageKind.COMMAND, 1)
    assert cid != command_id(other, "s0", MessageKind.COMMAND, 1)
    assert cid != command_id(legacy, "s0", MessageKind.COMMAND, 1)
    assert message_id(keyed, "s0", MessageKind.COMMAND, 1, 1) != message_id(
        other, "s0", MessageKind.COMMAND, 1, 1
    )
    assert key not in repr(keyed)
