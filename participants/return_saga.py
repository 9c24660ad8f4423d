"""The returns saga: a customer sends an item back.

create the return -> receive the item (it cannot be un-received: on a later failure it
is flagged for inspection) -> inspect (a person decides, within a deadline) -> accepted:
refund (the pivot: once money is on its way the saga only goes forward) -> restock ->
notify the customer; rejected: send the item back -> close the return as rejected.

Timeouts (at scale 1): a participant step 30 s a try (notifying 10 s: a refused one is
sent again soon, it follows the pivot); the inspection escalates after
two days and, with no decision after three, fails so the return is cancelled and the
item flagged; the saga as a whole has four days and ten minutes.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from participants import inventory, payments, returns
from saga_tasks import SagaDefinition, equals, human_step, saga, step

Reference = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
DAY = 86400.0


class ReturnPayload(BaseModel):
    """What starting a return takes: references and amounts, nothing personal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    return_id: Reference
    order_ref: Reference
    customer_id: Reference
    sku: Reference
    qty: int = Field(ge=1, le=1000)
    amount_cents: int = Field(ge=1, le=100_000_000)
    demo_faults: dict[str, str] | None = None


class Inspection(BaseModel):
    """The inspector's decision; the note is a reference to a document, not free text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["accepted", "rejected"]
    note_ref: Reference | None = None


def return_saga(time_scale: float = 1.0, inspection: float | None = None) -> SagaDefinition:
    """The returns saga; ``time_scale`` shrinks every timeout, as for the order saga;
    ``inspection``: seconds the inspector has (escalation at two thirds), whatever the
    scale, so tests and the demo can watch one time out."""
    if not 0 < time_scale <= 100:
        raise ValueError("ORDER_SAGA_TIME_SCALE must be in (0, 100]")
    decide_within = inspection if inspection is not None else time_scale * 3 * DAY

    def t(seconds: float) -> float:
        return seconds * time_scale

    accepted = equals("inspect.decision", "accepted")
    rejected = equals("inspect.decision", "rejected")
    return saga(
        "return",
        step("create_return", returns.create, compensation=returns.cancel, timeout=t(30)),
        step(
            "receive_item",
            inventory.receive,
            compensation=inventory.flag_for_inspection,
            timeout=t(30),
        ),
        human_step(
            "inspect",
            schema=Inspection,
            timeout=decide_within,
            escalate_after=decide_within * 2 / 3,
            on_timeout="compensate",
        ),
        step(
            "refund",
            payments.refund,
            compensation=payments.void_refund,
            timeout=t(60),
            when=accepted,
            pivot=True,
        ),
        step("restock", inventory.restock, timeout=t(30)),
        step("notify_customer", returns.notify, timeout=t(10), retry=5),
        step(
            "send_back", inventory.send_back, timeout=t(30), when=rejected, depends_on=["inspect"]
        ),
        step("close_rejected", returns.close_rejected, timeout=t(30)),
        version=1,
        timeout=t(600) + decide_within * 4 / 3,
        payload=ReturnPayload,
    )


def _inspection() -> float | None:
    value = os.environ.get("RETURN_INSPECTION_SECONDS", "")
    return float(value) if value else None


RETURN_SAGA = return_saga(float(os.environ.get("ORDER_SAGA_TIME_SCALE", "1")), _inspection())
