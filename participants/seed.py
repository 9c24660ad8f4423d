"""Demo and test data: stocked SKUs and customers with credit limits.

``seed`` sets the given values (tests, the demo, chaos runs and benchmarks start from
them); ``seed_command`` (``python -m participants.seed``) fills in what is missing and
leaves the rest alone, so it is safe to run again on a database already taking orders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import click
from sqlalchemy import Engine, create_engine, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

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
    engine_of: Callable[[str], Engine],
    stock_levels: Mapping[str, int] = DEFAULT_STOCK,
    customers: Mapping[str, int] = DEFAULT_CUSTOMERS,
    *,
    reset: bool = True,
) -> tuple[int, int]:
    """Stock the SKUs (in inventory's database) and open the customers (in payments');
    return how many of each were written. ``engine_of`` gives a participant's engine
    (``SagaApp.participant_engine``).

    With ``reset`` (the default), existing rows are set back to the given values: stock
    on hand with nothing reserved, credit limits, and each customer's open total recounted
    from their open authorizations; only for a database no saga is running on. Without
    it, existing rows are left as they are.
    """
    skus_written = customers_written = 0
    with engine_of("inventory").begin() as conn:
        if stock_levels:
            stmt = insert(stock).values(
                [{"sku": sku, "on_hand": qty, "reserved": 0} for sku, qty in stock_levels.items()]
            )
            if reset:
                stmt = stmt.on_conflict_do_update(
                    index_elements=["sku"], set_={"on_hand": stmt.excluded.on_hand, "reserved": 0}
                )
            else:
                stmt = stmt.on_conflict_do_nothing(index_elements=["sku"])
            skus_written = len(conn.execute(stmt.returning(stock.c.sku)).scalars().all())
    with engine_of("payments").begin() as conn:
        if customers:
            stmt2 = insert(customer).values(
                [{"customer_id": c, "credit_limit_cents": limit} for c, limit in customers.items()]
            )
            if reset:
                stmt2 = stmt2.on_conflict_do_update(
                    index_elements=["customer_id"],
                    set_={"credit_limit_cents": stmt2.excluded.credit_limit_cents},
                )
            else:
                stmt2 = stmt2.on_conflict_do_nothing(index_elements=["customer_id"])
            written = conn.execute(stmt2.returning(customer.c.customer_id)).scalars().all()
            customers_written = len(written)
            open_total = (
                select(func.coalesce(func.sum(authorization.c.amount_cents), 0))
                .where(
                    authorization.c.customer_id == customer.c.customer_id,
                    authorization.c.status == "AUTHORIZED",
                )
                .scalar_subquery()
            )
            if written:
                conn.execute(
                    update(customer)
                    .where(customer.c.customer_id.in_(written))
                    .values(authorized_cents=open_total)
                )
    return skus_written, customers_written


@click.command("seed")
@click.option(
    "--reset",
    is_flag=True,
    help="Set existing stock and credit back to the demo's values too (no saga running).",
)
def seed_command(reset: bool) -> None:
    """Stock the example's SKUs and open its customers, each in its participant's database
    (SAGA_PARTICIPANT_DATABASE_URL); idempotent."""
    from saga_tasks import Settings
    from saga_tasks.errors import SagaTasksError
    from saga_tasks.persistence.db import translated

    engines: dict[str, Engine] = {}

    def engine_of(name: str) -> Engine:
        if name not in engines:
            url = settings.participant_database(name)
            engines[name] = create_engine(
                url, poolclass=NullPool, connect_args={"connect_timeout": 5}
            )
        return engines[name]

    try:
        settings = Settings.from_env()
        try:
            with translated(settings.participant_database("inventory")):
                skus, customers = seed(engine_of, reset=reset)
        finally:
            for engine in engines.values():
                engine.dispose()
    except ProgrammingError as exc:
        raise click.ClickException(
            "the example's tables are missing: run "
            "saga-tasks --app participants.app:saga_app db upgrade"
        ) from exc
    except SagaTasksError as exc:
        raise click.ClickException(str(exc)) from exc
    if reset:
        click.echo(f"set {skus} SKUs and {customers} customers to the demo's values")
    else:
        click.echo(f"stocked {skus} new SKUs, opened {customers} new customers")


if __name__ == "__main__":
    seed_command()
