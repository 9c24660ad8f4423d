"""``saga-tasks`` in a participant's own process: given its own database only, as
``service_env`` gives it (``SAGA_DATABASE_URL`` empty, ``SAGA_PARTICIPANT_DATABASE_URL``
naming that participant alone)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from saga_tasks.ops.processes import service_env
from saga_tasks.testing import Isolation
from tests.helpers import ADMIN_URL, PREFIX


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saga_tasks.ops.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def orders_process(template_database):
    with Isolation(
        admin_database_url=ADMIN_URL,
        prefix=PREFIX,
        template=f"{template_database}_apart",
        participants=("orders", "inventory", "payments"),
    ) as iso:
        whole = {**os.environ, **iso.env(SAGA_TASKS_APP="participants.app:saga_app")}
        env = service_env(whole, "orders")
        assert env["SAGA_DATABASE_URL"] == ""
        assert env["SAGA_PARTICIPANT_DATABASE_URL"].startswith("orders=")
        yield env


@pytest.fixture
def orders_container(orders_process):
    """The same, as compose.yml gives the orders service: one plain URL."""
    url = orders_process["SAGA_PARTICIPANT_DATABASE_URL"].removeprefix("orders=")
    return {**orders_process, "SAGA_PARTICIPANT_DATABASE_URL": url}


def test_a_participant_migrates_its_own_database_with_only(orders_process):
    upgraded = cli(orders_process, "db", "upgrade", "--only", "orders")
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout == "orders at revision 0001 (orders)\n"
    current = cli(orders_process, "db", "current", "--only", "orders")
    assert current.returncode == 0, current.stderr
    assert current.stdout == "orders 0001\n"


def test_commands_needing_the_saga_database_say_so_in_one_line(orders_process, orders_container):
    for env in (orders_process, orders_container):
        for args in (("db", "upgrade"), ("db", "current")):
            done = cli(env, *args)
            assert done.returncode == 1, (args, done.stderr)
            assert "Traceback" not in done.stderr, (args, done.stderr[-800:])
            assert done.stderr.startswith("error: SAGA_DATABASE_URL is empty"), (args, done.stderr)
        checked = cli(env, "check")
        assert checked.returncode == 0, checked.stderr[-800:]
    assert cli(orders_container, "db", "upgrade", "--only", "orders").returncode == 0
