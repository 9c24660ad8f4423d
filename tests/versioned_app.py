"""The example deployment with two versions of the order saga side by side, for the tests
of versions: ``SAGA_TEST_VERSIONS`` ("1", "2" or "1,2") names those a process loads.

Version 2 authorizes the payment while the stock is reserved (both after the order is
created; the confirmation waits for both). Its first two steps are version 1's, unchanged.
"""

from __future__ import annotations

import os
from dataclasses import replace

from participants import inventory, orders, payments
from participants.order_saga import order_saga
from saga_tasks import SagaApp, SagaDefinition, Settings


def order_versions(time_scale: float = 1.0) -> dict[int, SagaDefinition]:
    v1 = order_saga(time_scale)
    parents = {"authorize_payment": ("create_order",), "confirm_order": ("reserve_stock",
               "authorize_payment")}  # fmt: skip
    steps = tuple(replace(s, depends_on=parents.get(s.name, s.depends_on)) for s in v1.steps)
    return {1: v1, 2: replace(v1, steps=steps, version=2)}


def build(versions: str, settings: Settings | None = None) -> SagaApp:
    found = order_versions(float(os.environ.get("ORDER_SAGA_TIME_SCALE", "1")))
    return SagaApp(
        sagas=[found[int(v)] for v in versions.split(",")],
        participants=[orders.participant, inventory.participant, payments.participant],
        settings=settings,
        name="versioned",
    )


saga_app = build(os.environ.get("SAGA_TEST_VERSIONS", "1,2"))
app = saga_app.celery
