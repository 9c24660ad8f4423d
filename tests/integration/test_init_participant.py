"""``saga-tasks init participant``: the chain every participant needed written by hand."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from sqlalchemy import create_engine, inspect
from sqlalchemy.pool import NullPool

from saga_tasks.testing import Isolation
from tests.helpers import ADMIN_URL, PREFIX

MODULE = textwrap.dedent(
    """
    from sqlalchemy import Column, Table, Text

    from saga_tasks import Participant, SagaApp, saga, step

    flights = Participant("flights", migrations="migrations/flights")
    seat = Table("seat", flights.metadata, Column("seat_id", Text, primary_key=True))


    @flights.command("book")
    def book(ctx):
        return {}


    saga_app = SagaApp(sagas=[saga("trip", step("book", book))], participants=[flights])
    """
)


def cli(*args: str, cwd, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saga_tasks.ops.cli", *args],
        cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def test_a_chain_written_by_init_migrates_the_participant_and_refuses_to_overwrite(tmp_path):
    (tmp_path / "trip.py").write_text(MODULE)
    made = cli("init", "participant", "flights", "--module", "trip:flights", cwd=tmp_path, env={})
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "migrations/flights/versions/0001_flights_schema.py").exists()
    assert 'Participant("flights", migrations="migrations/flights")' in made.stderr

    again = cli("init", "participant", "flights", cwd=tmp_path, env={})
    assert again.returncode == 2 and "not an empty directory" in again.stderr

    with Isolation(admin_database_url=ADMIN_URL, prefix=PREFIX) as iso:
        env = {**iso.env(), "SAGA_TASKS_APP": "trip:saga_app", "PYTHONPATH": str(tmp_path)}
        upgraded = cli("db", "upgrade", cwd=tmp_path, env=env)
        assert upgraded.returncode == 0, upgraded.stderr
        assert "flights at revision 0001" in upgraded.stdout
        engine = create_engine(iso.database_url, poolclass=NullPool)
        try:
            tables = set(inspect(engine).get_table_names(schema="flights"))
        finally:
            engine.dispose()
        assert {"command_ledger", "outbox", "redelivery", "alembic_version"} <= tables
        assert cli("db", "upgrade", cwd=tmp_path, env=env).returncode == 0, "run again: no-op"

        # The participant's own table, declared on its metadata without schema=: the next
        # revision is written with it, in the participant's schema, and migrates.
        written = cli("db", "revision", "flights", "-m", "seats", cwd=tmp_path, env=env)
        assert written.returncode == 0, written.stderr
        script = tmp_path / "migrations/flights/versions/0002_seats.py"
        assert f"wrote {script}" in written.stdout or "0002_seats.py" in written.stdout
        body = script.read_text()
        assert "op.create_table('seat'" in body and "schema='flights'" in body
        assert "command_ledger" not in body, "the library's tables are already at head"
        assert "flights at revision 0002" in cli("db", "upgrade", cwd=tmp_path, env=env).stdout
        engine = create_engine(iso.database_url, poolclass=NullPool)
        try:
            assert "seat" in inspect(engine).get_table_names(schema="flights")
        finally:
            engine.dispose()
        # Nothing changed since: no file, and it says so.
        same = cli("db", "revision", "flights", "-m", "noop", cwd=tmp_path, env=env)
        assert same.returncode == 0, same.stderr
        assert same.stdout.startswith("nothing to write: the database flights migrates matches")
        assert sorted(p.name for p in script.parent.glob("*.py")) == [
            "0001_flights_schema.py",
            "0002_seats.py",
        ]
        # A chain whose env.py names no metadata (init without --module) says what to do.
        env_py = tmp_path / "migrations/flights/env.py"
        env_py.write_text(env_py.read_text().replace("flights.metadata", "None"))
        blind = cli("db", "revision", "flights", "-m", "x", cwd=tmp_path, env=env)
        assert blind.returncode == 1 and blind.stderr.count("\n") == 1, blind.stderr
        assert "set target_metadata=<participant>.metadata" in blind.stderr
        unknown = cli("db", "revision", "hotels", "-m", "x", cwd=tmp_path, env=env)
        assert unknown.returncode == 2
        assert "'hotels': no participant with migrations= nor app chain" in unknown.stderr
        assert "(known: flights)" in unknown.stderr
