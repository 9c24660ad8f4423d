"""Outbox recovery, migrations and topology declaration against the real services."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from kombu import Connection
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.errors import TopologyMismatch
from saga_tasks.messaging.topology import Topology, declare_topology
from saga_tasks.ops.services import current_revision, current_revisions, upgrade
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.runtime.outlet import relay
from saga_tasks.testing import Isolation, queue_depths
from tests.helpers import ADMIN_URL, ORDER, PREFIX, drain, scalar


def _unpublish_and_age(engine, seconds: int = 60) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE saga.outbox SET published_at = NULL, "
                "created_at = created_at - make_interval(secs => :s)"
            ),
            {"s": seconds},
        )


def test_recovery_publishes_what_publish_after_commit_missed(order_app, settings):
    handle = order_app.start_saga("order", "r-1", ORDER)
    drain(settings.broker_url, "orders.commands")
    _unpublish_and_age(order_app.engine)
    report = relay(order_app.engine, saga_outbox, order_app.publisher, min_age_seconds=1, batch=10)
    assert (report.claimed, report.published, report.failed) == (1, 1, 0)
    (message,) = drain(settings.broker_url, "orders.commands")
    assert message["headers"]["saga_id"] == handle.saga_id
    assert (
        scalar(order_app.engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 0
    )
    again = relay(order_app.engine, saga_outbox, order_app.publisher, min_age_seconds=1, batch=10)
    assert again.claimed == 0


def test_recovery_leaves_young_rows_to_their_own_transaction(order_app, settings):
    order_app.start_saga("order", "r-2", ORDER)
    drain(settings.broker_url, "orders.commands")
    _unpublish_and_age(order_app.engine, seconds=0)
    report = relay(order_app.engine, saga_outbox, order_app.publisher, min_age_seconds=30, batch=10)
    assert report.claimed == 0


def test_concurrent_recoveries_publish_each_row_once(order_app, settings):
    for i in range(20):
        order_app.start_saga("order", f"r-c{i}", ORDER)
    drain(settings.broker_url, "orders.commands")
    _unpublish_and_age(order_app.engine)
    reports = []
    barrier = threading.Barrier(3)

    def run() -> None:
        barrier.wait()
        reports.append(
            relay(order_app.engine, saga_outbox, order_app.publisher, min_age_seconds=1, batch=7)
        )

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.published for r in reports) <= 20
    while relay(
        order_app.engine, saga_outbox, order_app.publisher, min_age_seconds=1, batch=7
    ).claimed:
        pass
    messages = drain(settings.broker_url, "orders.commands")
    assert len(messages) == 20
    assert len({m["headers"]["id"] for m in messages}) == 20


def test_recovery_with_the_broker_away_keeps_the_rows(order_app, settings):
    from dataclasses import replace

    from saga_tasks import SagaApp

    order_app.start_saga("order", "r-3", ORDER)
    drain(settings.broker_url, "orders.commands")
    _unpublish_and_age(order_app.engine)
    away = SagaApp(
        sagas=list(order_app.registry),
        settings=replace(
            settings, broker_url="amqp://guest:guest@127.0.0.1:5999//", publish_timeout=1.0
        ),
    )
    report = relay(away.engine, saga_outbox, away.publisher, min_age_seconds=1, batch=10)
    assert (report.published, report.failed) == (0, 1)
    # One attempt that worked (publish after commit), one that failed (recovery).
    assert scalar(order_app.engine, "SELECT publish_attempts FROM saga.outbox") == 2
    assert (
        scalar(order_app.engine, "SELECT count(*) FROM saga.outbox WHERE published_at IS NULL") == 1
    )
    report = relay(order_app.engine, saga_outbox, order_app.publisher, min_age_seconds=1, batch=10)
    assert report.published == 1
    assert len(drain(settings.broker_url, "orders.commands")) == 1


HEADS = {"orders": "0001", "inventory": "0002", "payments": "0002", "returns": "0001"}
"""The head of each example participant's chain."""


def test_migrations_from_empty_twice_and_concurrently(template_database):
    """The deploy step migrates the orchestrator's database and each participant's own;
    three at once serialize, and each database holds its own schema only."""
    from participants.app import saga_app
    from saga_tasks.persistence.tables import metadata

    names = tuple(saga_app.participants)
    with Isolation(admin_database_url=ADMIN_URL, prefix=PREFIX, participants=names) as iso:
        # Three deploy jobs at once, as separate processes (Alembic is not thread-safe).
        env = {**os.environ, **iso.env(SAGA_TASKS_APP="participants.app:saga_app")}
        jobs = [
            subprocess.Popen(
                [sys.executable, "-m", "saga_tasks.ops.cli", "db", "upgrade"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(3)
        ]
        outputs = [job.communicate(timeout=120)[0] for job in jobs]
        assert [job.returncode for job in jobs] == [0, 0, 0], outputs
        expected = "saga_tasks at revision 0010\n" + "".join(
            f"{n} at revision {HEADS[n]} ({n})\n" for n in names
        )
        assert all(out.endswith(expected) for out in outputs), outputs
        chain = {n: saga_app.participants[n].migrations for n in names}
        assert upgrade(iso.database_url) == [("saga_tasks", "0010")]
        assert current_revision(iso.database_url) == "0010"

        def tables(url: str) -> dict[str, int]:
            engine = create_engine(url, poolclass=NullPool)
            with engine.connect() as conn:
                found = conn.execute(
                    text(
                        "SELECT schemaname, count(*) FROM pg_tables "
                        "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') GROUP BY 1"
                    )
                )
                counts = dict(found.all())
            engine.dispose()
            return counts

        assert tables(iso.database_url) == {"saga": len(metadata.tables) + 1}
        for n in names:
            url = iso.participant_url(n)
            assert current_revisions(url, [chain[n]], library=False) == [(n, HEADS[n])]
            assert upgrade(url, [chain[n]], library=False) == [(n, HEADS[n])]
            own = saga_app.participants[n].metadata.tables
            assert tables(url) == {n: len(own) + 1}, "its own tables and version table only"


def test_the_saga_schema_migrates_without_any_app(template_database):
    from participants.orders import participant as orders
    from saga_tasks.persistence.tables import metadata

    with Isolation(admin_database_url=ADMIN_URL, prefix=PREFIX) as iso:
        url = iso.database_url
        alone = subprocess.run(
            [sys.executable, "-m", "saga_tasks.ops.cli", "db", "upgrade"],
            env={k: v for k, v in {**os.environ, **iso.env()}.items() if k != "SAGA_TASKS_APP"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert alone.returncode == 0, alone.stderr
        assert alone.stdout == "saga_tasks at revision 0010\n"
        assert "the saga schema only" in alone.stderr

        def schemas() -> dict[str, int]:
            engine = create_engine(url, poolclass=NullPool)
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT schemaname, count(*) FROM pg_tables "
                        "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
                        "GROUP BY schemaname"
                    )
                )
                counts = dict(rows.all())
            engine.dispose()
            return counts

        assert schemas() == {"saga": len(metadata.tables) + 1}
        assert current_revisions(url, [orders.migrations]) == [
            ("saga_tasks", "0010"),
            ("orders", "none"),
        ]
        assert "orders" not in schemas()  # reading revisions created nothing
        # A participant's chain can share the database (one database, a schema each),
        # on top, with a version table of its own.
        assert upgrade(url, [orders.migrations])[1] == ("orders", "0001")
        assert set(schemas()) == {"saga", "orders"}


def test_migrated_schema_matches_the_declared_tables(isolation):
    from participants import inventory, orders, payments
    from saga_tasks.persistence.tables import metadata

    engine = create_engine(isolation.database_url, poolclass=NullPool)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_name": lambda name, type_, _p: (
                    type_ != "schema" or name in {"saga", "orders", "inventory", "payments"}
                ),
                "compare_type": True,
            },
        )
        metas = [
            metadata,
            orders.participant.metadata,
            inventory.participant.metadata,
            payments.participant.metadata,
        ]
        diffs = [d for m in metas for d in compare_metadata(context, m)]
    engine.dispose()
    # compare_metadata reports every table of the other metadatas as "removed": keep real diffs.
    declared = {(t.schema, t.name) for m in metas for t in m.tables.values()}
    real = [
        d
        for d in diffs
        if not (d[0] == "remove_table" and (d[1].schema, d[1].name) in declared)
        and not (d[0] == "remove_index" and (d[1].table.schema, d[1].table.name) in declared)
        and not (d[0] == "remove_table" and d[1].name == "alembic_version")
    ]
    assert real == []


def test_a_participants_tables_come_from_the_library_as_it_declares_them(isolation):
    from saga_tasks import Participant
    from saga_tasks.persistence.schema import (
        create_participant_tables,
        create_redelivery_table,
        drop_participant_tables,
    )

    greeter = Participant("greeter")
    engine = create_engine(isolation.database_url, poolclass=NullPool)
    with engine.begin() as conn:
        create_participant_tables(conn, greeter.schema)
        create_redelivery_table(conn, greeter.schema)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_name": lambda name, type_, _p: type_ != "schema" or name == "greeter",
                "compare_type": True,
            },
        )
        assert compare_metadata(context, greeter.metadata) == []
    with engine.begin() as conn:
        drop_participant_tables(conn, greeter.schema)
    assert scalar(engine, "SELECT count(*) FROM pg_tables WHERE schemaname = 'greeter'") == 0
    engine.dispose()


def test_topology_declares_twice_and_names_a_mismatch(isolation):
    topology = Topology(command_queues=("inventory.commands",))
    first = declare_topology(isolation.broker_url, topology)
    assert declare_topology(isolation.broker_url, topology) == first
    assert queue_depths(isolation.broker_url, ["saga.dead_letter"]) == {"saga.dead_letter": 0}
    with Connection(isolation.broker_url) as conn:
        channel = conn.channel()
        channel.queue_declare("orders.commands", durable=True, arguments={"x-message-ttl": 5})
        channel.close()
    mismatched = Topology(command_queues=("orders.commands",))
    with pytest.raises(
        TopologyMismatch, match=r"queue 'orders.commands' exists on the broker with other arguments"
    ):
        declare_topology(isolation.broker_url, mismatched)
