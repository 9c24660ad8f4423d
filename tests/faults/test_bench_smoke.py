"""A short run of ``saga-tasks bench`` over the configurations the README's Performance
section leads with: the saga beside the same eight messages with no database
(``saga_floor``), with the same writes (``durable_chain8``), and as a DBOS workflow
(``dbos``, from the ``bench`` extra). The numbers are not
checked here (a loaded CI machine says nothing about speed): that each configuration
runs end to end, counts its commits and publishes, and that the report states its
targets with what was measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ADMIN_URL


@pytest.mark.exclusive  # a dozen worker processes in turn: numbers are not the point, calm is
@pytest.mark.timeout(400)
def test_a_short_bench_runs_the_saga_beside_its_floor_and_equal_work(tmp_path, template_database):
    from sqlalchemy.engine import make_url

    env = {
        **os.environ,
        "SAGA_DATABASE_URL": make_url(ADMIN_URL).set(database="unused").render_as_string(False),
    }
    result = subprocess.run(
        [
            sys.executable, "-m", "saga_tasks.ops.cli", "bench", "--sagas", "30",
            "--unloaded", "3", "--warmup", "5", "--only", "saga_floor,durable_chain8,saga,saga_unbatched,dbos",
            "--json", "--log-dir", str(tmp_path / "logs"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    found = report["configurations"]
    assert set(found) == {"saga_floor", "durable_chain8", "saga", "saga_unbatched", "dbos"}
    for name, r in found.items():
        assert r["items"] == 30 and r["throughput"] > 0, name
        assert r["unloaded_latency_ms"]["p50"] > 0, name
    # Eight tasks, each its own transaction; the floor writes nothing (a few commits of
    # the benchmark's own bookkeeping at most).
    assert found["durable_chain8"]["commits_per_item"] >= 8
    assert found["saga_floor"]["commits_per_item"] < 1
    if found["saga_floor"]["publishes_per_item"] is not None:  # the management API answers
        assert found["saga_floor"]["publishes_per_item"] >= 8
    assert report["ratio_vs_equal_work_chain"] > 0 and report["ratio_vs_dbos"] > 0
    # Group commit off: every reply and command its own transaction, about 9.5 a saga.
    assert found["saga_unbatched"]["commits_per_item"] >= 8
    assert report["ratio_batched_vs_unbatched"] > 0
    assert set(report["targets"]) == {
        "ratio_vs_dbos",
        "ratio_vs_equal_work_chain",
        "unloaded_p50_vs_durable_chain8",
        "machine_cpu_vs_saga_floor",
    }
    assert all(t["measured"] is not None for t in report["targets"].values())
