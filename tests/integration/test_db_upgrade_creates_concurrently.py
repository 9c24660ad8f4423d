"""``saga-tasks db upgrade`` run by several deploy jobs at once on a server where none of the
deployment's databases exists yet: each database is created once and migrated once."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from sqlalchemy.engine import make_url

from saga_tasks.testing import drop_database
from tests.helpers import ADMIN_URL, PREFIX


def test_deploy_jobs_at_once_create_each_database_once(services):
    ident = f"{PREFIX}fresh_{uuid.uuid4().hex[:8]}"

    def url(database: str) -> str:
        return make_url(ADMIN_URL).set(database=database).render_as_string(False)

    names = ("orders", "inventory", "payments")

    def env(attempt: int) -> dict[str, str]:
        return {
            **os.environ,
            "SAGA_TASKS_APP": "participants.app:saga_app",
            "SAGA_DATABASE_URL": url(f"{ident}_{attempt}"),
            "SAGA_PARTICIPANT_DATABASE_URL": url(f"{ident}_{attempt}_PARTICIPANT").replace(
                "_PARTICIPANT", "_{participant}"
            ),
        }

    try:
        for attempt in range(3):  # a race: a few rounds, each on databases of its own
            jobs = [
                subprocess.Popen(
                    [sys.executable, "-m", "saga_tasks.ops.cli", "db", "upgrade"],
                    env=env(attempt),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for _ in range(4)
            ]
            outputs = [job.communicate(timeout=180)[0] for job in jobs]
            assert [job.returncode for job in jobs] == [0] * 4, outputs
    finally:
        for attempt in range(3):
            for database in (f"{ident}_{attempt}", *(f"{ident}_{attempt}_{n}" for n in names)):
                drop_database(url(database))
