"""Which workers check the definition versions unfinished sagas use, and what a refusal
says (the check itself runs in ``tests/e2e/test_versions_side_by_side.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from saga_tasks.core.registry import Registry
from saga_tasks.errors import UnknownDefinitionVersion
from saga_tasks.runtime.versions import VersionInUse, refusal
from saga_tasks.worker.versions import decides_sagas
from tests.unit.sagas import diamond, linear

DB = "postgresql+psycopg2://saga@127.0.0.1/saga"


@pytest.mark.parametrize(
    ("consumed", "database_url", "checks"),
    [
        ({"saga.replies", "saga.maintenance"}, DB, True),
        ({"saga.maintenance"}, DB, True),  # the sweeper and the intake decide too
        (set(), DB, True),  # no -Q: every queue
        ({"orders.commands"}, DB, False),  # a participant sharing the database
        ({"orders.commands"}, "", False),  # a participant on its own database
        ({"saga.replies"}, "", False),  # cannot decide anything: its own error says so
    ],
)
def test_only_a_worker_that_decides_sagas_checks(consumed, database_url, checks):
    assert decides_sagas(consumed, database_url) is checks


def test_a_refusal_names_each_version_its_count_and_the_ways_out():
    registry = Registry([replace(linear(), version=2), diamond()])
    one = refusal([VersionInUse("linear", 1, 1)], registry)
    assert one.startswith(
        "refusing to start: saga type 'linear' version 1 is used by 1 unfinished saga "
        "(loaded here: 2). Keep that definition registered"
    )
    assert "saga-tasks migrate SAGA_ID --to-version V" in one
    two = refusal([VersionInUse("linear", 1, 3), VersionInUse("gone", 4, 2)], registry)
    assert "'linear' version 1 is used by 3 unfinished sagas (loaded here: 2); " in two
    assert "'gone' version 4 is used by 2 unfinished sagas (loaded here: none)" in two
    assert "Keep those definitions registered" in two


def test_a_version_not_loaded_is_named_with_those_that_are():
    registry = Registry([linear(), replace(linear(), version=3)])
    assert registry.versions("linear") == (1, 3) and registry.loaded("linear", 3)
    with pytest.raises(UnknownDefinitionVersion, match=r"version 2 .* \(loaded: 1, 3\)"):
        registry.get("linear", 2)
