"""Finding the user's SagaApp by ``SAGA_TASKS_APP``, as ``celery -A`` finds its app."""

from __future__ import annotations

import sys
import textwrap

import pytest

from saga_tasks.app import SagaApp, load_app
from saga_tasks.errors import ConfigurationError

MODULE = textwrap.dedent(
    """
    from saga_tasks import Participant, SagaApp, saga, step

    visits = Participant("visits")


    @visits.command("note")
    def note(ctx):
        return {}


    saga_app = SagaApp(sagas=[saga("visit", step("note", note))], participants=[visits])
    """
)


def test_the_app_module_is_found_in_the_working_directory_as_celery_finds_it(tmp_path, monkeypatch):
    """``saga-tasks db upgrade`` could not import the user's module from the directory
    ``celery -A`` found it in: a console script's path holds its own directory, not the
    working one."""
    (tmp_path / "visit_app.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "visit_app", raising=False)
    try:
        assert isinstance(load_app("visit_app:saga_app"), SagaApp)
    finally:
        sys.modules.pop("visit_app", None)


def test_a_module_found_nowhere_names_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        load_app("no_such_app_module:saga_app")
    assert str(tmp_path) in str(refused.value)
    assert "run from the directory that holds it, or install it" in str(refused.value)
