"""Two participants, each with a database of its own, whose tables carry the same schema
name (each service keeps its tables in schema ``svc`` of its own database)."""

from __future__ import annotations

import pytest

from saga_tasks import Participant, SagaApp, SagaStatus, Settings, saga, step
from saga_tasks.persistence.schema import create_participant_tables, create_redelivery_table
from saga_tasks.testing import Isolation, pump, ready
from tests.helpers import ADMIN_URL, PREFIX, scalar

alpha = Participant("alpha", schema="svc")
beta = Participant("beta", schema="svc")


@alpha.command("first")
def first(ctx):
    return {"alpha": True}


@beta.command("second")
def second(ctx):
    return {"beta": True}


TWO = saga("two", step("first", first, timeout=10), step("second", second, timeout=10))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_each_outbox_row_is_marked_in_its_own_database(template_database, mode):
    with Isolation(
        admin_database_url=ADMIN_URL, prefix=PREFIX, participants=("alpha", "beta")
    ) as iso:
        settings = Settings.from_env(
            {},
            database_url=iso.database_url,
            participant_database_url=iso.participant_database_url,
            broker_url=iso.broker_url,
            publish_mode=mode,
        )
        app = ready(SagaApp(sagas=[TWO], participants=[alpha, beta], settings=settings))
        try:
            for p in (alpha, beta):
                with app.participant_engine(p.name).begin() as conn:
                    create_participant_tables(conn, p.schema)
                    create_redelivery_table(conn, p.schema)
            handle = app.start_saga("two", "k-1", {})
            pump(app)
            assert app.flush(10)
            assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPLETED
            unpublished = {
                p.name: scalar(
                    app.participant_engine(p.name),
                    "SELECT count(*) FROM svc.outbox WHERE published_at IS NULL",
                )
                for p in (alpha, beta)
            }
            assert unpublished == {"alpha": 0, "beta": 0}
        finally:
            app.close()
