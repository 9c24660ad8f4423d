"""``testing.ready(app)`` migrates what ``saga-tasks db upgrade`` does: the saga schema and
the app's chains, then each participant's own chain, in the database that participant
uses in that app (its own, or the orchestrator's when they share one)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks import SagaApp, Settings
from saga_tasks.persistence.db import dispose_all
from saga_tasks.testing import Isolation, ready
from tests.helpers import ADMIN_URL, PARTICIPANTS, PREFIX


def _tables(url: str, schema: str) -> set[str]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema},
            )
            return {r[0] for r in rows}
    finally:
        engine.dispose()


def _declared(participant) -> set[str]:
    return {t.name for t in participant.metadata.tables.values()} | {"alembic_version"}


def _ready_app(iso: Isolation) -> SagaApp:
    from participants.order_saga import order_saga

    settings = Settings.from_env(
        {},
        database_url=iso.database_url,
        participant_database_url=iso.participant_database_url,
        broker_url=iso.broker_url,
    )
    return ready(SagaApp(sagas=[order_saga()], participants=list(PARTICIPANTS), settings=settings))


@pytest.mark.parametrize("apart", [True, False], ids=["a database each", "one database"])
def test_ready_runs_each_participants_chain_where_it_keeps_its_tables(services, apart):
    names = tuple(p.name for p in PARTICIPANTS) if apart else ()
    with Isolation(admin_database_url=ADMIN_URL, prefix=PREFIX, participants=names) as iso:
        app = _ready_app(iso)
        try:
            assert "alembic_version" in _tables(iso.database_url, "saga")
            for p in PARTICIPANTS:
                own = iso.participant_url(p.name) if apart else iso.database_url
                assert _declared(p) <= _tables(own, p.schema), p.name
                if apart:
                    assert not _tables(iso.database_url, p.schema), p.name
            _ready_app(iso).close()  # twice: nothing left to do
        finally:
            app.close()
            dispose_all()
