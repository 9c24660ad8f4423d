"""``payload=``: a handler's pydantic model of the saga's payload, refused payloads named
by where and why, never by value."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from saga_tasks import CommandContext, Participant
from saga_tasks.errors import BusinessRejection
from saga_tasks.participant import INVALID_PAYLOAD


class Hold(BaseModel):
    order_ref: str
    quantity: int = Field(gt=0)


class _Command:
    """The one field a handler's context reads here."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload


def _context(payload: dict[str, Any]) -> CommandContext:
    return CommandContext(conn=None, command=_Command(payload), now=datetime.now(UTC))  # type: ignore[arg-type]


def _participant() -> Participant:
    return Participant("stock")


def test_the_handler_gets_the_validated_model_after_the_context():
    stock = _participant()
    seen: list[Hold] = []

    @stock.command("hold", payload=Hold)
    def hold(ctx: CommandContext, order: Hold) -> dict[str, Any]:
        seen.append(order)
        return {"held": order.quantity}

    assert hold(_context({"order_ref": "o-1", "quantity": "3", "extra": 1})) == {"held": 3}
    assert seen == [Hold(order_ref="o-1", quantity=3)]
    assert stock.handlers["hold"].payload is Hold


def test_a_refused_payload_names_the_fields_and_the_reasons_but_no_value():
    stock = _participant()

    @stock.command("hold", payload=Hold)
    def hold(ctx: CommandContext, order: Hold) -> None:
        raise AssertionError("a refused payload never reaches the handler")

    secret = "4111-1111-1111-1111"
    with pytest.raises(BusinessRejection) as refused:
        hold(_context({"order_ref": 7, "quantity": secret}))
    assert refused.value.code == INVALID_PAYLOAD
    detail = refused.value.message
    assert detail.startswith("Hold refused the payload (")
    assert "order_ref: string_type" in detail and "quantity: int_parsing" in detail
    assert secret not in str(refused.value) and secret not in detail


def test_a_missing_field_is_named():
    stock = _participant()

    @stock.compensation("release", undoes="hold", payload=Hold)
    def release(ctx: CommandContext, order: Hold) -> None:
        return None

    with pytest.raises(BusinessRejection) as refused:
        release(_context({"quantity": 1}))
    assert "order_ref: missing" in refused.value.message


def test_a_handler_without_a_model_gets_the_context_alone():
    stock = _participant()

    @stock.command("count")
    def count(ctx: CommandContext) -> dict[str, Any]:
        return {"keys": sorted(ctx.payload)}

    assert count(_context({"b": 1, "a": 2})) == {"keys": ["a", "b"]}
    assert stock.handlers["count"].payload is None


@pytest.mark.parametrize("model", [dict, Hold(order_ref="o", quantity=1), "Hold"])
def test_payload_takes_a_model_class_only(model):
    stock = _participant()
    with pytest.raises(TypeError, match=r"stock\.hold: payload= takes a pydantic model class"):
        stock.command("hold", payload=model)


def test_the_handler_stays_a_frozen_record():
    stock = _participant()

    @stock.command("hold", payload=Hold)
    def hold(ctx: CommandContext, order: Hold) -> None:
        return None

    assert dataclasses.is_dataclass(hold)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hold.payload = None  # type: ignore[misc]


class Tagged(BaseModel):
    kind: Literal["cat"]
    lives: int


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    balances: dict[str, int] = {}
    pet: Tagged | None = Field(default=None, discriminator="kind")
    items: list[int] = []


def _refused(payload: dict[str, Any]) -> str:
    stock = _participant()

    @stock.command("hold", payload=Strict)
    def hold(ctx: CommandContext, order: Strict) -> None:
        return None

    with pytest.raises(BusinessRejection) as refused:
        hold(_context(payload))
    return refused.value.message


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        ({"balances": {"4111111111111111": "x"}}, "balances.*: int_parsing"),
        ({"secret-ssn-123-45-6789": 1}, "*: extra_forbidden"),
        ({"pet": {"kind": "cat", "lives": "nine-4111"}}, "pet.*.lives: int_parsing"),
        ({"items": [1, "card-4111"]}, "items.1: int_parsing"),
    ],
)
def test_a_location_names_fields_and_positions_only_never_what_the_payload_holds(payload, said):
    message = _refused(payload)
    assert said in message, message
    for secret in ("4111", "ssn", "nine"):
        assert secret not in message


def test_a_refusal_names_five_errors_and_counts_the_rest():
    message = _refused({"items": ["x"] * 100_000})
    assert message.count("int_parsing") == 5 and message.endswith("; +99995 more)")
    assert len(message) < 300
