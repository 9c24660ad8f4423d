"""What a chaos run must find in the database once every saga has ended.

The library's checker (``saga_tasks.testing.check_invariants``) covers what holds for
any deployment: every saga ended, histories explain them, outboxes are empty, nothing
published was lost, and each step's effect agrees with its status, operators' work by
hand counted. This module adds what only the order example knows:

- how to read each step's effect from the participants' tables, each in its own
  database (``effects``);
- stock is conserved (each SKU's reserved count is what its held reservations hold)
  and each customer's open total is what their open authorizations hold;
- a participant's effect happens at most once per saga (one reservation, one
  authorization held);
- only completed sagas (or sagas waiting for a person, or steps undone by hand) hold
  stock, a payment or a confirmed order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from participants import inventory, orders, payments, returns
from saga_tasks.testing import invariants
from saga_tasks.testing.invariants import (
    ByHand,
    Done,
    EngineOf,
    evidence,
    operator_accounting,
    saga_ids_in,
    undone_by_hand,
)

PARTICIPANTS = (
    orders.participant,
    inventory.participant,
    payments.participant,
    returns.participant,
)
"""Every participant of the example app: each has its database, its ledger and its outbox."""

__all__ = [
    "PARTICIPANTS",
    "Done",
    "check_invariants",
    "effects",
    "evidence",
    "lost_messages",
    "operator_accounting",
    "saga_ids_in",
]


@dataclass(frozen=True)
class Effects:
    """What the participants hold for one saga."""

    reserved: int = 0
    authorized: int = 0
    order: str | None = None

    def by_step(self) -> dict[str, bool]:
        return {
            "create_order": self.order in ("PENDING", "CONFIRMED"),
            "reserve_stock": self.reserved > 0,
            "authorize_payment": self.authorized > 0,
            "confirm_order": self.order == "CONFIRMED",
        }


def effects(engine_of: EngineOf, saga_ids: Sequence[str]) -> dict[str, Mapping[str, bool]]:
    """Each saga's step effects, read from the three participants' own databases."""

    def per_saga(participant: str, sql: str) -> dict[str, Any]:
        with engine_of(participant).connect() as conn:
            return {str(r[0]): r[1] for r in conn.execute(text(sql))}

    reserved = per_saga(
        "inventory",
        "SELECT saga_id, count(*) FROM inventory.reservation WHERE status = 'RESERVED' GROUP BY 1",
    )
    authorized = per_saga(
        "payments",
        "SELECT saga_id, count(*) FROM payments.authorization WHERE status = 'AUTHORIZED' "
        "GROUP BY 1",
    )
    order = per_saga("orders", "SELECT saga_id, status FROM orders.orders")
    return {
        s: Effects(int(reserved.get(s, 0)), int(authorized.get(s, 0)), order.get(s)).by_step()
        for s in saga_ids
    }


def check_invariants(
    engine: Engine, participant_engine: EngineOf | None = None
) -> tuple[list[str], dict[str, int]]:
    """Every broken invariant as one line, and the final status counts; ``engine`` is the
    orchestrator's database, ``participant_engine`` each participant's (default: the same)."""
    engine_of = participant_engine or (lambda _name: engine)
    report = invariants.check_invariants(
        engine, PARTICIPANTS, participant_engine=engine_of, effects=effects, lost=False
    )
    with engine.connect() as conn:
        status = {
            str(r[0]): str(r[1])
            for r in conn.execute(text("SELECT saga_id, status FROM saga.saga_instance"))
        }

    def q(participant: str, sql: str) -> list[Any]:
        with engine_of(participant).connect() as conn:
            return list(conn.execute(text(sql)))

    report.violations += _conservation(q)
    report.violations += _holders(q, status, report.by_hand)
    return report.violations, report.statuses


def lost_messages(engine: Engine, participant_engine: EngineOf | None = None) -> list[str]:
    """Published messages that never reached their consumer and are on no record."""
    return invariants.lost_messages(engine, PARTICIPANTS, participant_engine=participant_engine)


def _conservation(q: Any) -> list[str]:
    found = []
    for sku, reserved, held in q(
        "inventory",
        """SELECT s.sku, s.reserved, coalesce(sum((i->>'qty')::int), 0)
           FROM inventory.stock s
           LEFT JOIN inventory.reservation r ON r.status = 'RESERVED'
           LEFT JOIN LATERAL jsonb_array_elements(r.items) i ON i->>'sku' = s.sku
           GROUP BY s.sku, s.reserved HAVING s.reserved <> coalesce(sum((i->>'qty')::int), 0)""",
    ):
        found.append(f"stock of {sku}: {reserved} reserved, reservations hold {held}")
    for customer_id, total, held in q(
        "payments",
        """SELECT c.customer_id, c.authorized_cents, coalesce(sum(a.amount_cents), 0)
           FROM payments.customer c
           LEFT JOIN payments.authorization a
             ON a.customer_id = c.customer_id AND a.status = 'AUTHORIZED'
           GROUP BY c.customer_id, c.authorized_cents
           HAVING c.authorized_cents <> coalesce(sum(a.amount_cents), 0)""",
    ):
        found.append(
            f"customer {customer_id}: {total} cents authorized, open authorizations hold {held}"
        )
    for saga_id, n in q(
        "payments",
        """SELECT saga_id, count(*) FROM payments.authorization WHERE status = 'AUTHORIZED'
           GROUP BY saga_id HAVING count(*) > 1""",
    ):
        found.append(f"saga {saga_id} has {n} payments authorized")
    for saga_id, n in q(
        "inventory",
        """SELECT saga_id, count(*) FROM inventory.reservation WHERE status = 'RESERVED'
           GROUP BY saga_id HAVING count(*) > 1""",
    ):
        found.append(f"saga {saga_id} has {n} reservations held")
    return found


def _holders(
    q: Any, status: Mapping[str, str], hand: Mapping[tuple[str, str], ByHand]
) -> list[str]:
    """Only completed sagas, sagas waiting for a person, or steps undone by hand hold
    stock, a payment or a confirmed order."""
    found = []
    keep = ("COMPLETED", "MANUAL_REVIEW")

    def holders(participant: str, sql: str) -> list[tuple[str, str]]:
        ids = sorted({str(r[0]) for r in q(participant, sql)})
        return [(s, status.get(s, "unknown")) for s in ids if status.get(s) not in keep]

    reserved = "SELECT saga_id FROM inventory.reservation WHERE status = 'RESERVED'"
    for saga_id, saga_status in holders("inventory", reserved):
        if not undone_by_hand(hand, saga_id, "reserve_stock"):
            found.append(f"saga {saga_id} is {saga_status} but still holds stock")
    authorized = "SELECT saga_id FROM payments.authorization WHERE status = 'AUTHORIZED'"
    for saga_id, saga_status in holders("payments", authorized):
        if not undone_by_hand(hand, saga_id, "authorize_payment"):
            found.append(f"saga {saga_id} is {saga_status} but its payment is still authorized")
    confirmed = "SELECT saga_id FROM orders.orders WHERE status = 'CONFIRMED'"
    for saga_id, saga_status in holders("orders", confirmed):
        found.append(f"saga {saga_id} is {saga_status} but its order is confirmed")
    return found
