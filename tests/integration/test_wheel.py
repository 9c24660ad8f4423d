"""The wheel stands alone: built from pyproject.toml and installed into a fresh venv where
the example cannot be imported, it migrates an empty database for an app of its user's
own (one participant, one step) and runs that app's saga through real worker processes.

Twice: once borrowing this environment's packages (the newest, the lock) through a ``.pth``
file, and once installed by pip with the lowest versions pyproject.toml declares
(``constraints/lowest.txt``) and no extra, as a participant's service would install it,
so the declared floor is true and the core needs no web stack. The checkout is never on
the fresh venv's path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.testing import Isolation, WorkerProcess, wait_for
from tests.helpers import ADMIN_URL, PREFIX

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]

SHOP = '''
"""A user's app: the greeter participant, and a saga of one step that asks it to greet."""

from pathlib import Path

from sqlalchemy import Column, Table, Text
from sqlalchemy.dialects.postgresql import UUID, insert

from saga_tasks import CommandContext, Participant, SagaApp, saga, step

greeter = Participant("greeter")
greeting = Table(
    "greeting",
    greeter.metadata,
    Column("saga_id", UUID(as_uuid=False), primary_key=True),
    Column("name", Text, nullable=False),
    schema="greeter",
)


@greeter.command("greet")
def greet(ctx: CommandContext) -> dict[str, str]:
    name = ctx.payload["name"]
    ctx.conn.execute(
        insert(greeting).values(saga_id=ctx.saga_id, name=name).on_conflict_do_nothing()
    )
    return {"greeted": name}


saga_app = SagaApp(
    sagas=[saga("greeting", step("greet", greet, timeout=30))],
    participants=[greeter],
    name="shop",
    migrations=[str(Path(__file__).resolve().parent / "shop_migrations")],
)
app = saga_app.celery
'''

SHOP_ENV = """
from saga_tasks.persistence.schema import run_migrations

run_migrations(version_table_schema="shop", schemas={"greeter"})
"""

SHOP_0001 = '''
"""The greeter's schema: its greetings, and the ledger and outbox every participant has."""

import sqlalchemy as sa
from alembic import op

from saga_tasks.persistence.schema import create_participant_tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_participant_tables(op, "greeter")
    op.create_table(
        "greeting",
        sa.Column("saga_id", sa.UUID(as_uuid=False), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        schema="greeter",
    )
'''

PROBE = """
import importlib.metadata, importlib.util, json, os, sys
import saga_tasks
print(json.dumps({
    "path": [os.path.realpath(p or os.getcwd()) for p in sys.path],
    "saga_tasks": saga_tasks.__file__,
    "participants": importlib.util.find_spec("participants") is not None,
    "fastapi": importlib.util.find_spec("fastapi") is not None,
    "versions": {
        name: importlib.metadata.version(name) for name in ("celery", "kombu", "sqlalchemy")
    },
}))
"""


class FreshWorker(WorkerProcess):
    """A worker run by the fresh venv's interpreter instead of this one."""

    python: Path

    def command(self) -> list[str]:
        return [str(self.python), *super().command()[1:]]


def build_wheel(dist: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = dist.glob("saga_tasks-*.whl")
    return wheel


LOWEST = REPO / "constraints" / "lowest.txt"


def lowest_venv(venv: Path, wheel: Path) -> Path:
    """A venv with the wheel and its dependencies at their lowest declared versions,
    installed by pip from the package index, no extra."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         "-c", str(LOWEST), str(wheel)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def fresh_venv(venv: Path, wheel: Path) -> Path:
    """A venv holding the wheel alone; this environment's third-party packages are added
    to its path after the install, so pip sees an empty environment."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "borrowed_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


def write_shop(app_dir: Path) -> None:
    versions = app_dir / "shop_migrations" / "versions"
    versions.mkdir(parents=True)
    (app_dir / "shop.py").write_text(textwrap.dedent(SHOP))
    (app_dir / "shop_migrations" / "env.py").write_text(textwrap.dedent(SHOP_ENV))
    (versions / "0001_greeter.py").write_text(textwrap.dedent(SHOP_0001))


def lowest_declared() -> dict[str, str]:
    pins = [line.split("==") for line in LOWEST.read_text().splitlines() if "==" in line]
    return {name.lower(): version for name, version in pins}


@pytest.mark.parametrize("versions", ["newest", "lowest"])
@pytest.mark.timeout(600)
def test_the_wheel_alone_runs_a_users_saga_on_an_empty_database(
    services, tmp_path, monkeypatch, versions
):
    wheel = build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    distribution, version = wheel.name.split("-")[:2]
    tops = {name.split("/")[0] for name in names}
    assert tops == {"saga_tasks", f"{distribution}-{version}.dist-info"}
    assert "saga_tasks/_migrations/env.py" in names
    assert "saga_tasks/py.typed" in names, "type checkers would ignore the package's hints"
    assert "saga_tasks/_migrations/versions/0001_saga_schema.py" in names
    assert "saga_tasks/__init__.pyi" in names  # the public names, read at import too
    assert not [n for n in names if "participants" in n or n.startswith(("tests/", "tools/"))]

    make = lowest_venv if versions == "lowest" else fresh_venv
    python = make(tmp_path / "venv", wheel)
    bin_dir = python.parent
    app_dir = tmp_path / "app"
    write_shop(app_dir)
    monkeypatch.chdir(app_dir)  # workers and commands start here: the checkout is not on path

    def run(*args: str, env: dict[str, str]) -> str:
        done = subprocess.run(
            list(args), env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    base = {**os.environ, "PYTHONPATH": str(app_dir), "SAGA_TASKS_APP": "shop:saga_app"}
    probe = json.loads(run(str(python), "-c", PROBE, env=base))
    assert not probe["participants"]
    if versions == "lowest":
        floor = lowest_declared()
        assert probe["versions"] == {name: floor[name] for name in probe["versions"]}
        assert not probe["fastapi"], "the core installs no web stack"
        web = subprocess.run(
            [str(bin_dir / "saga-tasks"), "web"], env=base, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert web.returncode == 1, web.stderr
        assert web.stderr.startswith("error: saga-tasks web needs the web extra"), web.stderr
        assert "pip install 'saga_tasks[web]'" in web.stderr and "Traceback" not in web.stderr
    assert Path(probe["saga_tasks"]).is_relative_to(tmp_path / "venv")
    assert str(REPO) not in probe["path"]

    with Isolation(admin_database_url=ADMIN_URL, prefix=PREFIX) as iso:
        env = {**base, **iso.env()}
        migrated = run(str(bin_dir / "saga-tasks"), "db", "upgrade", env=env)
        assert migrated == "saga_tasks at revision 0010\nshop_migrations at revision 0001\n"

        workers = []
        for name, queues in (
            ("orchestrator", ["saga.replies", "saga.maintenance"]),
            ("greeter", ["greeter.commands"]),
        ):
            worker = FreshWorker(
                "shop", queues=queues, name=name, env=env, log_dir=tmp_path / "logs"
            )
            worker.python = python
            workers.append(worker)
        try:
            for worker in workers:
                worker.start(wait=False)
            for worker in workers:
                worker.wait_ready(timeout=60)

            started = run(
                str(bin_dir / "saga-tasks"), "start", "greeting", "--key", "ada",
                "--payload", '{"name": "Ada"}', "--json", env=env,
            )  # fmt: skip
            saga_id = json.loads(started)["saga_id"]

            engine = create_engine(iso.database_url, poolclass=NullPool)
            try:

                def status() -> str | None:
                    with engine.connect() as conn:
                        value = conn.execute(
                            text("SELECT status FROM saga.saga_instance WHERE saga_id = :s"),
                            {"s": saga_id},
                        ).scalar_one()
                    return value if value in ("COMPLETED", "COMPENSATED", "FAILED") else None

                assert wait_for(status, timeout=30, interval=0.1, describe="saga ended") == (
                    "COMPLETED"
                )
                with engine.connect() as conn:
                    assert conn.execute(text("SELECT name FROM greeter.greeting")).all() == [
                        ("Ada",)
                    ]
                    assert conn.execute(
                        text("SELECT outcome FROM greeter.command_ledger")
                    ).scalars().all() == ["success"]
            finally:
                engine.dispose()
        except BaseException:
            for worker in workers:
                print(f"\n----- {worker.name} log (tail) -----\n{worker.tail(60)}")
            raise
        finally:
            for worker in workers:
                worker.stop(timeout=10)
        for worker in workers:
            assert not worker.alive()
            with pytest.raises(ProcessLookupError):
                os.killpg(worker.pid, 0)  # the whole process group is gone
