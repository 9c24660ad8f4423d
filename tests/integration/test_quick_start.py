"""The README's quick start, run as it is written there: ``trip.py`` into an empty
directory, then each line of its shell block, with real workers, against a database and a
vhost of the test's own (which the block's own commands create)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from saga_tasks.ops.processes import wait_for
from saga_tasks.testing import RabbitAdmin, drop_database
from tests.helpers import ADMIN_URL, PREFIX

README = Path(__file__).resolve().parents[2] / "README.md"
END = "<!-- --8<-- [end:quick-start] -->"
"""Where the quick start ends: the docs' tutorial includes the README up to this marker."""


def blocks() -> tuple[str, list[str]]:
    section = README.read_text().split("### Quick start", 1)[1].split(END, 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.S)
    shell = re.search(r"```sh\n(.*?)```", section, re.S)
    assert python and shell, "the README lost its quick start"
    lines = [line for line in shell.group(1).splitlines() if line.strip()]
    return python.group(1), lines


def test_the_quick_start_is_short_and_on_the_first_screen():
    text = README.read_text()
    assert text.index("### Quick start") < text.index(END) < text.index("\n## "), "first"
    assert len(text[: text.index(END)].splitlines()) <= 80, "on the first screen or two"
    python, shell = blocks()
    assert len(python.splitlines()) + len(shell) <= 40


@pytest.mark.timeout(300)
def test_the_quick_start_runs_as_written(tmp_path):
    python, shell = blocks()
    (tmp_path / "trip.py").write_text(python)
    ident = f"{PREFIX}qs_{os.getpid()}"
    env = {**os.environ}
    for key in ("SAGA_DATABASE_URL", "SAGA_BROKER_URL", "SAGA_TASKS_APP", "PYTHONPATH"):
        env.pop(key, None)
    database_url = make_url(ADMIN_URL).set(database=ident).render_as_string(False)
    exports: dict[str, str] = {}
    for line in [line for line in shell if line.startswith("export ")]:
        for word in shlex.split(line.split("#", 1)[0])[1:]:
            key, _, value = word.partition("=")
            exports[key] = value
    # The block's own values name the reader's services; the test's name its own.
    assert set(exports) == {"SAGA_DATABASE_URL", "SAGA_BROKER_URL", "SAGA_TASKS_APP"}
    env.update(
        SAGA_DATABASE_URL=database_url,
        SAGA_BROKER_URL=f"amqp://guest:guest@127.0.0.1:5672/{ident}",
        SAGA_TASKS_APP=exports["SAGA_TASKS_APP"],
    )
    workers: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        for i, line in enumerate(line for line in shell if not line.startswith("export ")):
            command = line.split("  #", 1)[0].strip()
            if command.endswith("&"):
                with (logs / f"worker-{i}.log").open("wb") as out:  # the child keeps its own
                    workers.append(
                        subprocess.Popen(
                            command.rstrip("&").strip(), shell=True, cwd=tmp_path, env=env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                        )
                    )  # fmt: skip
                continue
            done = subprocess.run(  # the README's line, as a reader runs it
                command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"

        def completed() -> bool | None:
            listed = subprocess.run(
                ["saga-tasks", "list", "--type", "trip", "--json"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            found = json.loads(listed.stdout)["sagas"] if listed.returncode == 0 else []
            return True if [s["status"] for s in found] == ["COMPLETED"] else None

        def tails() -> str:
            return "\n".join(p.read_text()[-2000:] for p in sorted(logs.iterdir()))

        wait_for(completed, timeout=90, interval=0.5, describe=lambda: f"saga completed\n{tails()}")
        assert (tmp_path / "migrations" / "hotels" / "env.py").exists()
    finally:
        for worker in workers:
            try:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
            except ProcessLookupError:
                pass
        drop_database(database_url)
        RabbitAdmin().delete_vhost(ident)
