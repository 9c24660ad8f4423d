"""Who may send what: the rules of ``saga_tasks.core.senders``."""

from __future__ import annotations

import pytest

from saga_tasks.core.senders import H_SENT_BY, OPEN, Senders, publisher, sender_of
from saga_tasks.errors import ConfigurationError

QUEUES = {"inventory.commands": "inventory", "payments.commands": "payments"}
SENDERS = Senders(prefix="saga-", participants=QUEUES)


def test_without_a_prefix_nothing_is_checked():
    assert OPEN.refusal(None, "inventory.commands", "reply") is None
    assert OPEN.refusal("guest", None, "reply") is None
    assert OPEN.stranger(None, "reply") is None


def test_a_reply_is_believed_from_its_steps_participant_or_the_orchestrator():
    assert SENDERS.refusal("saga-inventory", "inventory.commands", "reply") is None
    assert SENDERS.refusal("saga-orchestrator", "inventory.commands", "reply") is None
    assert SENDERS.refusal("saga-orchestrator", None, "reply") is None


@pytest.mark.parametrize(
    ("sender", "says"),
    [
        (None, "names no sender (no AMQP user_id)"),
        ("", "names no sender"),
        ("saga-payments", "from broker user 'saga-payments'; only 'saga-inventory' or"),
        ("guest", "which is no service of this deployment"),
        ("saga-", "which is no service of this deployment"),
    ],
)
def test_anyone_else_is_refused_with_a_reason(sender, says):
    reason = SENDERS.refusal(sender, "inventory.commands", "reply for step 'reserve'")
    assert reason is not None and says in reason


def test_a_participant_cannot_speak_for_a_step_no_participant_owns():
    reason = SENDERS.refusal("saga-inventory", None, "reply for step 'nope'")
    assert reason is not None and "no participant owns" in reason


def test_users_and_names():
    assert SENDERS.users() == {
        "saga-orchestrator": None,
        "saga-inventory": "inventory.commands",
        "saga-payments": "payments.commands",
    }
    assert SENDERS.user_of("payments.commands") == "saga-payments"
    assert SENDERS.user_of("nope.commands") is None
    assert publisher(None) == "an unknown publisher (no AMQP user_id)"
    assert publisher("saga-x") == "broker user 'saga-x'"


def test_a_participant_named_orchestrator_is_refused_once_users_are_checked():
    Senders(prefix="", participants={"orchestrator.commands": "orchestrator"})
    with pytest.raises(ConfigurationError, match="share the orchestrator's broker user"):
        Senders(prefix="saga-", participants={"orchestrator.commands": "orchestrator"})


def test_a_services_own_copy_is_judged_by_the_sender_of_the_original():
    own = "saga-orchestrator"
    assert sender_of(own, {H_SENT_BY: "saga-payments"}, own) == "saga-payments"
    assert sender_of(own, {H_SENT_BY: ""}, own) is None  # the original had no user_id
    assert sender_of(own, {}, own) == own  # not a copy: its own message
    # Anyone else naming a sender is read as itself: nobody relays for another.
    assert sender_of("saga-payments", {H_SENT_BY: "saga-inventory"}, own) == "saga-payments"
    assert sender_of(None, {H_SENT_BY: own}, own) is None
