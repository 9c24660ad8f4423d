"""The order saga: create order -> reserve stock -> authorize payment -> confirm order.

Stock failure cancels the order; a declined payment releases the stock and cancels
the order. Confirming is the point of no return, so it has no compensation.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from participants import inventory, orders, payments
from saga_tasks import SagaDefinition, saga, step

Reference = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class OrderItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sku: Reference
    qty: int = Field(ge=1, le=1000)


class OrderPayload(BaseModel):
    """What starting an order saga takes: references and amounts, nothing personal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    customer_id: Reference
    items: list[OrderItem] = Field(min_length=1, max_length=50)
    amount_cents: int = Field(ge=1, le=100_000_000)
    demo_faults: dict[str, str] | None = None


def order_saga(time_scale: float = 1.0, on_dead_letter: str = "compensate") -> SagaDefinition:
    """The order saga; ``time_scale`` shrinks every timeout (tests and chaos runs use 0.05).

    ``on_dead_letter`` is every step's dead-letter policy (compensate, manual_review).

    Every process of one deployment must use the same scale: deadlines are computed by
    whichever process starts the saga or handles its messages.
    """
    if not 0 < time_scale <= 100:
        raise ValueError("ORDER_SAGA_TIME_SCALE must be in (0, 100]")

    def t(seconds: float) -> float:
        return seconds * time_scale

    dl = on_dead_letter
    return saga(
        "order",
        step(
            "create_order",
            orders.create,
            compensation=orders.cancel,
            timeout=t(30),
            on_dead_letter=dl,
        ),
        step(
            "reserve_stock",
            inventory.reserve,
            compensation=inventory.release,
            timeout=t(30),
            on_dead_letter=dl,
        ),
        step(
            "authorize_payment",
            payments.authorize,
            compensation=payments.void,
            timeout=t(60),
            on_dead_letter=dl,
        ),
        step("confirm_order", orders.confirm, timeout=t(30), on_dead_letter=dl),
        version=1,
        timeout=t(600),
        payload=OrderPayload,
    )


ORDER_SAGA = order_saga(float(os.environ.get("ORDER_SAGA_TIME_SCALE", "1")))
