"""Hot statements prepared once per connection: the same answers as plain text, and a
session that lost them (DISCARD ALL, a pooler) costs a retry, not a stuck worker."""

from __future__ import annotations

import pytest
from sqlalchemy import Integer, column

from saga_tasks.errors import ConcurrencyConflict
from saga_tasks.persistence.db import get_engine
from saga_tasks.persistence.prepared import Prepared

ADD = Prepared("test_add", "SELECT CAST(:a AS integer) + :b AS n", {"a": "integer", "b": "integer"},
               [column("n", Integer)])  # fmt: skip


def test_prepared_and_plain_give_the_same_rows(order_app):
    with order_app.engine.connect() as conn:
        assert ADD.execute(conn, {"a": 2, "b": 3}).scalar_one() == 5
        assert ADD.execute(conn, {"a": 4, "b": 3}).scalar_one() == 7  # prepared already
        assert "test_add" in conn.connection.info["saga_tasks.prepared"]
        names = conn.exec_driver_sql("SELECT name FROM pg_prepared_statements").scalars().all()
        assert "test_add" in names
    plain = get_engine(order_app.settings.database_url, prepare=False)  # SAGA_DB_PREPARE=0
    with plain.connect() as conn:
        assert ADD.execute(conn, {"a": 1, "b": 1}).scalar_one() == 2
        names = conn.exec_driver_sql("SELECT name FROM pg_prepared_statements").scalars().all()
        assert "test_add" not in names, "plain text: nothing prepared on this session"


def test_a_session_that_lost_its_statements_retries_and_prepares_again(order_app):
    with order_app.engine.connect() as conn:
        assert ADD.execute(conn, {"a": 1, "b": 2}).scalar_one() == 3
        conn.commit()
        conn.exec_driver_sql("DEALLOCATE ALL")  # what DISCARD ALL or a pooler does to it
        with pytest.raises(ConcurrencyConflict):
            ADD.execute(conn, {"a": 1, "b": 2})
        conn.rollback()
        assert ADD.execute(conn, {"a": 1, "b": 2}).scalar_one() == 3


@pytest.mark.parametrize(
    ("sql", "types", "complaint"),
    [
        ("SELECT :a", {"a": "int", "b": "int"}, "parameters"),
        ("SELECT '10:30' || :a", {"a": "text"}, "string literal"),
        ("SELECT :a LIKE 'x%'", {"a": "text"}, "placeholder"),
    ],
)
def test_statements_that_would_not_survive_preparing_are_refused(sql, types, complaint):
    with pytest.raises(ValueError, match=complaint):
        Prepared("bad", sql, types)


PROBE = Prepared(
    "test_probe",
    "SELECT count(*) FROM public.replan_probe p "
    "JOIN jsonb_to_recordset(CAST(:ids AS jsonb)) AS r(id int) ON p.id = r.id",
    {"ids": "jsonb"},
)


def test_a_statement_is_planned_again_once_its_table_has_grown(order_app, monkeypatch):
    """PostgreSQL keeps a prepared statement's generic plan until something invalidates
    it; on a server whose autovacuum never analyses, a plan made while the table held one
    row went on reading it whole at every size (the saga's decision statement read
    thousands of dead flow-control rows per reply). Prepared again as time passes (here
    at once), the plan finds the rows by their index."""
    from saga_tasks.persistence import prepared

    monkeypatch.setattr(prepared, "REPLAN_FIRST", 0.0, raising=False)
    with order_app.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE public.replan_probe (id int PRIMARY KEY, pad text)")
        conn.exec_driver_sql("INSERT INTO public.replan_probe VALUES (1, 'x')")
    try:
        with order_app.engine.connect() as conn:
            for _ in range(8):  # past the five custom plans: the generic one is kept
                assert PROBE.execute(conn, {"ids": '[{"id": 1}]'}).scalar_one() == 1
            conn.commit()
            conn.exec_driver_sql(
                "INSERT INTO public.replan_probe "
                "SELECT g, repeat('x', 200) FROM generate_series(2, 50000) g"
            )
            conn.commit()

            def seq_scans() -> int:
                return conn.exec_driver_sql(
                    "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'replan_probe'"
                ).scalar_one()

            before = seq_scans()
            assert PROBE.execute(conn, {"ids": '[{"id": 7}, {"id": 9}]'}).scalar_one() == 2
            assert seq_scans() == before, "a plan made for one row read 50,000 of them"
    finally:
        with order_app.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE public.replan_probe")
