"""A reply forged by someone who knows a saga's public id: its command ids are keyed by the
saga's own secret, so a guessed id answers for nothing; the forgery is on record."""

from __future__ import annotations

import uuid

from saga_tasks.core.states import Classification, SagaStatus, StepStatus
from tests.helpers import ORDER, drain, events, pump, rows, run_command, run_reply, scalar

OLD_NAMESPACE = uuid.UUID("8d3c2a51-4a8e-4e39-9a55-6d1b3f0c7e21")
"""The namespace ids were once derived in from the saga id alone (public in the code)."""


def guessed(saga_id: str, step: str) -> str:
    return str(uuid.uuid5(OLD_NAMESPACE, f"{saga_id}/{step}/command/1/command"))


def test_a_reply_with_an_id_derived_from_the_public_saga_id_changes_nothing(order_app, settings):
    handle = order_app.start_saga("order", "forged-1", ORDER)
    (command,) = drain(settings.broker_url, "orders.commands")
    real_id = command["headers"]["saga_command_id"]
    assert real_id != guessed(handle.saga_id, "create_order")
    assert scalar(
        order_app.engine,
        "SELECT id_key IS NOT NULL FROM saga.saga_instance WHERE saga_id = :s",
        s=handle.saga_id,
    )

    # The forger answers create_order with success, naming the id it computed.
    run_command(order_app, command)
    (reply,) = drain(settings.broker_url, "saga.replies")
    forged = {
        "headers": {
            **reply["headers"],
            "id": str(uuid.uuid4()),
            "saga_command_id": guessed(handle.saga_id, "create_order"),
        },
        "kwargs": reply["kwargs"],
        "args": [],
    }
    assert run_reply(order_app, forged) is Classification.INVALID
    state = order_app.orchestrator.get(handle.saga_id)
    assert state.steps["create_order"].status is StepStatus.REQUESTED
    assert state.version == 1, "nothing changed"
    (noted,) = rows(
        order_app.engine,
        "SELECT reason FROM saga.saga_history WHERE saga_id = :s AND event = 'invalid_message'",
        s=handle.saga_id,
    )
    assert "did not send" in noted["reason"]

    # The participant's own reply still counts, and the saga goes on as if nothing came.
    assert run_reply(order_app, reply) is Classification.ACCEPTED
    pump(order_app, settings.broker_url)
    assert order_app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED
    happened = [event for event, _actor in events(order_app, handle.saga_id)]
    assert happened.count("step_succeeded") == 4
