"""What a chaos run must find in the database once every saga has ended.

The library's checker (``saga_tasks.testing.check_invariants``) covers what holds for
any deployment: every saga ended, histories explain them, outboxes are empty, nothing
published was lost, and each step's effect agrees with its status, operators' work by
hand counted. This module adds what only the order example knows:

- how to read each step's effect from the participants' tables (``effects``);
- stock is conserved (each SKU's reserved count is what its held reservations hold)
  and each customer's open total is what their open authorizations hold;
- a participant's effect happens at most once per saga (one reservation, one
  authorization held);
- only completed sagas (or sagas waiting for a person, or steps undone by hand) hold
  stock, a payment or a confirmed order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from participants import inventory, orders, payments
from saga_tasks.testing import invariants
from saga_tasks.testing.invariants import (
    ByHand,
    Done,
    evidence,
    operator_accounting,
    saga_ids_in,
    undone_by_hand,
)

PARTICIPANTS = (orders.participant, inventory.participant, payments.participant)

__all__ = [
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


def effects(conn: Connection) -> dict[str, Mapping[str, bool]]:
    """Each saga's step effects, read from the three participants' tables."""
    rows = conn.execute(
        text(
            """WITH r AS (SELECT saga_id, count(*) AS n FROM inventory.reservation
                          WHERE status = 'RESERVED' GROUP BY 1),
                    a AS (SELECT saga_id, count(*) AS n FROM payments.authorization
                          WHERE status = 'AUTHORIZED' GROUP BY 1)
               SELECT s.saga_id::text, coalesce(r.n, 0), coalesce(a.n, 0), o.status
               FROM saga.saga_instance s
               LEFT JOIN r ON r.saga_id = s.saga_id
               LEFT JOIN a ON a.saga_id = s.saga_id
               LEFT JOIN orders.orders o ON o.saga_id = s.saga_id"""
        )
    )
    return {r[0]: Effects(int(r[1]), int(r[2]), r[3]).by_step() for r in rows}


def check_invariants(engine: Engine) -> tuple[list[str], dict[str, int]]:
    """Every broken invariant as one line, and the final status counts."""
    report = invariants.check_invariants(engine, PARTICIPANTS, effects=effects, lost=False)
    with engine.connect() as conn:

        def q(sql: str, **params: Any) -> list[Any]:
            return list(conn.execute(text(sql), params))

        report.violations += _conservation(q)
        report.violations += _holders(q, report.by_hand)
    return report.violations, report.statuses


def lost_messages(engine: Engine) -> list[str]:
    """Published messages that never reached their consumer and are on no record."""
    return invariants.lost_messages(engine, PARTICIPANTS)


def _conservation(q: Any) -> list[str]:
    found = []
    for sku, reserved, held in q(
        """SELECT s.sku, s.reserved, coalesce(sum((i->>'qty')::int), 0)
           FROM inventory.stock s
           LEFT JOIN inventory.reservation r ON r.status = 'RESERVED'
           LEFT JOIN LATERAL jsonb_array_elements(r.items) i ON i->>'sku' = s.sku
           GROUP BY s.sku, s.reserved HAVING s.reserved <> coalesce(sum((i->>'qty')::int), 0)"""
    ):
        found.append(f"stock of {sku}: {reserved} reserved, reservations hold {held}")
    for customer_id, total, held in q(
        """SELECT c.customer_id, c.authorized_cents, coalesce(sum(a.amount_cents), 0)
           FROM payments.customer c
           LEFT JOIN payments.authorization a
             ON a.customer_id = c.customer_id AND a.status = 'AUTHORIZED'
           GROUP BY c.customer_id, c.authorized_cents
           HAVING c.authorized_cents <> coalesce(sum(a.amount_cents), 0)"""
    ):
        found.append(
            f"customer {customer_id}: {total} cents authorized, open authorizations hold {held}"
        )
    for saga_id, n in q(
        """SELECT saga_id, count(*) FROM payments.authorization WHERE status = 'AUTHORIZED'
           GROUP BY saga_id HAVING count(*) > 1"""
    ):
        found.append(f"saga {saga_id} has {n} payments authorized")
    for saga_id, n in q(
        """SELECT saga_id, count(*) FROM inventory.reservation WHERE status = 'RESERVED'
           GROUP BY saga_id HAVING count(*) > 1"""
    ):
        found.append(f"saga {saga_id} has {n} reservations held")
    return found


def _holders(q: Any, hand: Mapping[tuple[str, str], ByHand]) -> list[str]:
    """Only completed sagas, sagas waiting for a person, or steps undone by hand hold
    stock, a payment or a confirmed order."""
    found = []
    keep = "('COMPLETED', 'MANUAL_REVIEW')"
    for saga_id, status in q(
        f"""SELECT DISTINCT r.saga_id::text, s.status FROM inventory.reservation r
            JOIN saga.saga_instance s USING (saga_id)
            WHERE r.status = 'RESERVED' AND s.status NOT IN {keep}"""  # noqa: S608
    ):
        if not undone_by_hand(hand, saga_id, "reserve_stock"):
            found.append(f"saga {saga_id} is {status} but still holds stock")
    for saga_id, status in q(
        f"""SELECT DISTINCT a.saga_id::text, s.status FROM payments.authorization a
            JOIN saga.saga_instance s USING (saga_id)
            WHERE a.status = 'AUTHORIZED' AND s.status NOT IN {keep}"""  # noqa: S608
    ):
        if not undone_by_hand(hand, saga_id, "authorize_payment"):
            found.append(f"saga {saga_id} is {status} but its payment is still authorized")
    for saga_id, status in q(
        f"""SELECT o.saga_id::text, s.status FROM orders.orders o
            JOIN saga.saga_instance s USING (saga_id)
            WHERE o.status = 'CONFIRMED' AND s.status NOT IN {keep}"""  # noqa: S608
    ):
        found.append(f"saga {saga_id} is {status} but its order is confirmed")
    return found
