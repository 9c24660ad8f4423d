"""Demo and test data: stocked SKUs and customers with credit limits (idempotent upserts)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, func, select, update
from sqlalchemy.dialects.postgresql import insert

from participants.inventory import stock
from participants.payments import authorization, customer

DEFAULT_STOCK: Mapping[str, int] = {f"sku-{i}": 1_000 for i in range(1, 11)} | {
    "sku-scarce": 3,
    "sku-empty": 0,
}
DEFAULT_CUSTOMERS: Mapping[str, int] = {f"c-{i}": 10_000_000 for i in range(1, 21)} | {
    "c-low": 1_000,  # declines anything above 10.00
}


def seed(
    engine: Engine,
    stock_levels: Mapping[str, int] = DEFAULT_STOCK,
    customers: Mapping[str, int] = DEFAULT_CUSTOMERS,
) -> None:
    """Set stock on hand (nothing reserved) and credit limits to the given values; each
    customer's open total is recounted from their open authorizations."""
    with engine.begin() as conn:
        if stock_levels:
            stmt = insert(stock).values(
                [{"sku": sku, "on_hand": qty, "reserved": 0} for sku, qty in stock_levels.items()]
            )
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["sku"], set_={"on_hand": stmt.excluded.on_hand, "reserved": 0}
                )
            )
        if customers:
            stmt2 = insert(customer).values(
                [{"customer_id": c, "credit_limit_cents": limit} for c, limit in customers.items()]
            )
            conn.execute(
                stmt2.on_conflict_do_update(
                    index_elements=["customer_id"],
                    set_={"credit_limit_cents": stmt2.excluded.credit_limit_cents},
                )
            )
            open_total = (
                select(func.coalesce(func.sum(authorization.c.amount_cents), 0))
                .where(
                    authorization.c.customer_id == customer.c.customer_id,
                    authorization.c.status == "AUTHORIZED",
                )
                .scalar_subquery()
            )
            conn.execute(
                update(customer)
                .where(customer.c.customer_id.in_(list(customers)))
                .values(authorized_cents=open_total)
            )
