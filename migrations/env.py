"""Alembic environment: one transaction, under an advisory lock, for the whole upgrade.

Two ``saga-tasks db upgrade`` runs at once (two deploy jobs) serialize on the lock;
the second finds the schema at head and does nothing.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import MetaData, create_engine, pool, text

MIGRATION_LOCK = 0x5A6A_0001

config = context.config


def target_metadata() -> list[MetaData]:
    from participants import inventory, orders, payments
    from saga_tasks.persistence.tables import metadata

    return [
        metadata,
        orders.participant.metadata,
        inventory.participant.metadata,
        payments.participant.metadata,
    ]


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    if type_ == "schema":
        return name in {"saga", "orders", "inventory", "payments"}
    return True


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: set SAGA_DATABASE_URL or sqlalchemy.url")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection, connection.begin():
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        connection.execute(text("CREATE SCHEMA IF NOT EXISTS saga"))
        context.configure(
            connection=connection,
            target_metadata=target_metadata(),
            version_table_schema="saga",
            include_schemas=True,
            include_name=_include_name,
            compare_type=True,
        )
        context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) mode is not supported; run against a database")
run_migrations_online()
