"""The project's documentation as the tests read it: the README and the pages of docs/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def page(name: str) -> Path:
    """A page of the docs site, by its path under docs/ (e.g. ``guides/testing.md``)."""
    path = DOCS / name
    assert path.exists(), f"docs/{name} is gone"
    return path


def every_page() -> list[Path]:
    """The README and every page of the docs site."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def all_text() -> str:
    """Every page's text, one after another."""
    return "\n\n".join(p.read_text() for p in every_page())
