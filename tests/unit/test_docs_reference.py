"""The reference pages are what the code writes: every command, setting and route, current."""

from __future__ import annotations

from tools import docs_reference


def test_the_reference_pages_are_written_from_the_current_code():
    assert docs_reference.stale() == [], "run python -m tools.docs_reference"


def test_every_command_of_the_cli_has_its_help_on_the_page():
    page = docs_reference.commands_page()
    for path in (
        "saga-tasks db upgrade",
        "saga-tasks broker declare",
        "saga-tasks init participant",
    ):
        assert f"## `{path}`" in page
    assert "saga-tasks bench" not in page, "the tools' commands are not the library's"


def test_every_route_of_the_api_is_on_its_page():
    from saga_tasks.ops.trust import ROUTES

    page = docs_reference.http_api_page()
    pages = ("/", "/docs", "/openapi.json")  # the dashboard and the docs: not in the document
    api = [r for r in ROUTES if r.path not in pages and not r.path.startswith("/ui")]
    assert api
    missing = [f"{r.method} {r.path}" for r in api if f"## `{r.method} {r.path}`" not in page]
    assert missing == []
