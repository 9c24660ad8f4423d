"""A step whose handler declares ``payload=``: a payload the model refuses fails the step
at receipt with ``invalid_payload`` (where and why, no value), the saga compensates what
went before, and the handler never runs; a payload it takes reaches the handler as the
model. Through the real queues and databases, by ``pump``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import text

from saga_tasks import CommandContext, Participant, SagaApp, SagaStatus, Settings, saga, step
from saga_tasks.core.states import StepStatus
from saga_tasks.persistence.schema import create_participant_tables, create_redelivery_table
from saga_tasks.testing import Isolation, check_invariants, pump, ready

shop = Participant("shop")
charged: list[int] = []


class Charge(BaseModel):
    order_ref: str
    amount_cents: int = Field(gt=0)


@shop.command("reserve")
def reserve(ctx: CommandContext) -> dict[str, Any]:
    return {"reserved": True}


@shop.compensation("unreserve", undoes="reserve")
def unreserve(ctx: CommandContext) -> None:
    return None


@shop.command("charge", payload=Charge)
def charge(ctx: CommandContext, order: Charge) -> dict[str, Any]:
    charged.append(order.amount_cents)
    return {"charged": order.amount_cents}


ORDER = saga(
    "typed_order",
    step("reserve", reserve, compensation=unreserve, timeout=10),
    step("charge", charge, timeout=10, depends_on=["reserve"]),
)


def test_a_payload_the_model_refuses_compensates_and_a_good_one_reaches_the_handler():
    charged.clear()
    with Isolation() as iso:
        settings = Settings.from_env({}, database_url=iso.database_url, broker_url=iso.broker_url)
        app = ready(SagaApp(sagas=[ORDER], participants=[shop], settings=settings))
        try:
            with app.engine.begin() as conn:
                create_participant_tables(conn, shop.schema)
                create_redelivery_table(conn, shop.schema)
            good = app.start_saga("typed_order", "o-1", {"order_ref": "o-1", "amount_cents": 250})
            bad = app.start_saga(
                "typed_order", "o-2", {"order_ref": "o-2", "amount_cents": "card-4111"}
            )
            pump(app)

            assert app.orchestrator.get(good.saga_id).status is SagaStatus.COMPLETED
            assert charged == [250], "the handler ran once, for the good payload, with the model"

            refused = app.orchestrator.get(bad.saga_id)
            assert refused.status is SagaStatus.COMPENSATED
            assert refused.steps["charge"].status is StepStatus.FAILED
            assert refused.steps["charge"].error == "invalid_payload"
            assert refused.steps["reserve"].status is StepStatus.COMPENSATED
            with app.engine.connect() as conn:
                reasons = (
                    conn.execute(
                        text(
                            "SELECT reason FROM saga.saga_history WHERE saga_id = :id "
                            "AND step = 'charge' AND reason IS NOT NULL"
                        ),
                        {"id": bad.saga_id},
                    )
                    .scalars()
                    .all()
                )
            said = " ".join(reasons)
            assert "Charge refused the payload (amount_cents: int_parsing)" in said, reasons
            assert "card-4111" not in said
            assert check_invariants(app.engine, [shop]).ok
        finally:
            app.close()
