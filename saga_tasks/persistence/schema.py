"""Migrating schemas: the Alembic environment every chain runs in, and a participant's tables.

``saga-tasks db upgrade`` runs the library's chain (the ``saga`` schema), then each chain
the app declares in ``SagaApp(migrations=[...])``, all in one transaction under one
advisory lock: two deploy jobs at once serialize, and the second finds every chain at
head. Each chain's ``env.py`` is one call::

    from saga_tasks.persistence.schema import run_migrations

    run_migrations(version_table_schema="shop", schemas={"greeter"}, target_metadata=[...])

A participant's command ledger and outbox belong to the library, not to the app: the
app's own migration creates them next to its business tables with
``create_participant_tables(op, "greeter")``. What that function creates never changes;
a later library version that changes those tables ships a function that migrates them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import Connection, MetaData, create_engine, pool, text
from sqlalchemy.dialects import postgresql

if TYPE_CHECKING:
    from alembic.operations import Operations

MIGRATION_LOCK = 0x5A6A_0001
"""Advisory lock every migration run holds for its whole transaction."""


def lock_migrations(connection: Connection) -> None:
    """Wait until no other migration run holds the lock; hold it until this transaction ends."""
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})


def run_migrations(
    *,
    version_table_schema: str,
    version_table: str = "alembic_version",
    schemas: Collection[str] = (),
    target_metadata: MetaData | Sequence[MetaData] | None = None,
) -> None:
    """The body of a chain's ``env.py``.

    ``version_table_schema`` (created if missing) holds the chain's own version table, so
    chains never share one. ``schemas`` are the schemas the chain owns: autogenerate
    compares those only. Under ``saga-tasks db upgrade`` the chain runs on the connection
    (and transaction) the command passes in ``config.attributes["connection"]``; run alone
    by Alembic's command line it opens its own from ``sqlalchemy.url``, under the same lock.
    """
    from alembic import context

    if context.is_offline_mode():
        raise RuntimeError("offline (SQL script) mode is not supported; run against a database")
    owned = {version_table_schema, *schemas}

    def include_name(name: str | None, type_: str, _parents: object) -> bool:
        return type_ != "schema" or name in owned

    def run(connection: Connection) -> None:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{version_table_schema}"'))
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=version_table,
            version_table_schema=version_table_schema,
            include_schemas=True,
            include_name=include_name,
            compare_type=True,
        )
        context.run_migrations()

    config = context.config
    shared = config.attributes.get("connection")
    if shared is not None:
        run(shared)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "no database URL: saga-tasks db upgrade and db revision pass it; run alone by "
            "Alembic, set sqlalchemy.url"
        )
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection, connection.begin():
            lock_migrations(connection)
            run(connection)
    finally:
        engine.dispose()


def create_participant_tables(target: Operations | Connection, schema: str) -> None:
    """Create ``schema`` if missing, and in it a participant's command ledger and outbox.

    ``target`` is a migration's ``op`` or a connection. The tables are those of
    ``saga_tasks.persistence.tables.ledger_table`` and ``outbox_table`` as of the saga
    schema's revision 0001, written out here so that a migration calling this creates the
    same tables whatever library version runs it.
    """
    op = _operations(target)
    op.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
    op.create_table(
        "command_ledger",
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reply_message_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("reply", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("compensates", sa.UUID(as_uuid=False), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("command_id"),
        schema=schema,
    )
    op.create_table(
        "outbox",
        sa.Column("message_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("recovered", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
        schema=schema,
    )
    op.create_index(
        f"ix_{schema}_outbox_unpublished",
        "outbox",
        ["created_at"],
        unique=False,
        schema=schema,
        postgresql_where=sa.text("published_at IS NULL"),
    )


def create_redelivery_table(target: Operations | Connection, schema: str) -> None:
    """Create ``schema``'s redelivery counts (``tables.redelivery_table``): a participant
    with a database of its own counts the redeliveries of its commands there, to
    dead-letter one that keeps killing its worker.

    Not part of ``create_participant_tables``, whose tables never change: a participant
    schema created before this table existed gets it from a migration calling this.
    """
    op = _operations(target)
    op.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
    op.create_table(
        "redelivery",
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column(
            "first_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "last_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("consumer", "message_id", name=f"pk_{schema}_redelivery"),
        schema=schema,
    )


def drop_participant_tables(target: Operations | Connection, schema: str) -> None:
    """Drop what ``create_participant_tables`` and ``create_redelivery_table`` created,
    except the schema itself."""
    op = _operations(target)
    op.execute(sa.text(f'DROP TABLE IF EXISTS "{schema}".redelivery'))
    op.drop_index(f"ix_{schema}_outbox_unpublished", table_name="outbox", schema=schema)
    op.drop_table("outbox", schema=schema)
    op.drop_table("command_ledger", schema=schema)


def _operations(target: Operations | Connection) -> Operations:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    if isinstance(target, Connection):
        return Operations(MigrationContext.configure(target))
    return target
