"""The reference pages of the documentation, written from the code so they cannot drift.

    python -m tools.docs_reference          write docs/reference/{commands,settings,http-api}.md
    python -m tools.docs_reference --check  exit 1 naming each page that differs (CI's test)

Every command from click (``saga_tasks.ops.cli:main``; the tools' commands are the
repository's, not the library's, and are left out), every setting from ``Settings``, and the
HTTP API from the web app's OpenAPI document with the scope each route needs
(``ops.trust.ROUTES``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
RUN = "python -m tools.docs_reference"
WIDTH = 96
"""Columns of the help text click renders (fixed, so the page does not depend on a terminal)."""

GENERATED = (
    "<!-- Written by `python -m tools.docs_reference` from the code; edit the code, "
    "then run it. -->\n\n"
)


# -- commands -------------------------------------------------------------------------------


def _commands(
    command: click.Command, ctx: click.Context
) -> Iterator[tuple[click.Context, click.Command]]:
    yield ctx, command
    if isinstance(command, click.Group):
        # The group's own commands only: plugins (entry points) depend on what is installed.
        for name in sorted(command.commands):
            sub = command.commands[name]
            if sub.hidden:
                continue
            yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def commands_page() -> str:
    """Every command of ``saga-tasks`` with its help as click prints it."""
    from saga_tasks.ops.cli import main

    # The root as a plain group: its help lists the library's commands, not the plugins.
    from saga_tasks.ops.cli.plugins import EDGES, edge, load

    edges = {name: load(e) for name in EDGES if (e := edge(name)) is not None}
    library = click.Group(
        main.name,
        commands={**main.commands, **edges},
        params=main.params,
        help=main.help,
        callback=main.callback,
    )
    root = click.Context(
        library, info_name="saga-tasks", terminal_width=WIDTH, max_content_width=WIDTH
    )
    parts = [
        "# Every command\n\n",
        GENERATED,
        "What `saga-tasks COMMAND --help` prints, for each command of the library. "
        "The [CLI guide](cli.md) says how they fit together; distributions may add commands "
        "of their own (entry-point group `saga_tasks.commands`), not listed here.\n",
    ]
    for ctx, command in _commands(library, root):
        parts.append(f"\n## `{ctx.command_path}`\n\n```text\n{command.get_help(ctx)}\n```\n")
    return "".join(parts)


# -- settings -------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_page() -> str:
    """Every environment variable ``Settings`` reads, with its default and meaning."""
    from saga_tasks.config import Settings

    lines = [
        "# Every setting\n",
        GENERATED.rstrip("\n") + "\n",
        "Every process reads the same environment variables; the [configuration guide]"
        "(configuration.md) says how they fit together. A value that would silently switch a "
        "guarantee off (a batch of 0, a beat lease that can lapse between two renewals, NaN or "
        "infinite seconds) is refused at start, with the setting and its bound named.\n",
        "| variable | default | meaning |",
        "|---|---|---|",
    ]
    for variable, default, doc in Settings.documented():
        shown = f"`{default}`" if default else "(empty)"
        lines.append(f"| `{variable}` | {_cell(shown)} | {_cell(doc)} |")
    return "\n".join(lines) + "\n"


# -- the HTTP API ---------------------------------------------------------------------------


def _type(schema: dict[str, Any], components: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        kinds = [_type(s, components) for s in schema["anyOf"]]
        return " or ".join(k for k in kinds if k != "null") + (
            " or null" if "null" in kinds else ""
        )
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"array of {_type(schema.get('items', {}), components)}"
    bounds = [
        f"{word} {_number(schema[key])}"
        for key, word in (
            ("minimum", ">="),
            ("maximum", "<="),
            ("minLength", "length >="),
            ("maxLength", "length <="),
        )
        if key in schema
    ]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _model(name: str, components: dict[str, Any]) -> list[str]:
    schema = components.get(name, {})
    if "enum" in schema:
        return [f"`{name}`: one of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
    required = set(schema.get("required", ()))
    lines = [f"`{name}`:", "", "| field | type | required |", "|---|---|---|"]
    for field, prop in schema.get("properties", {}).items():
        yes = "yes" if field in required else "no"
        lines.append(f"| `{field}` | {_cell(_type(prop, components))} | {yes} |")
    return [*lines, ""]


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        if "$ref" in schema:
            yield str(schema["$ref"]).rsplit("/", 1)[-1]
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def http_api_page(openapi: dict[str, Any] | None = None) -> str:
    """Each route of the HTTP API: the scope it needs, its parameters, body and answers."""
    from saga_tasks.ops.trust import ROUTES

    document = openapi if openapi is not None else _openapi()
    components = document.get("components", {}).get("schemas", {})
    scopes = {(r.method, r.path): r.scope for r in ROUTES}
    lines = [
        "# HTTP API\n",
        GENERATED.rstrip("\n") + "\n",
        "`saga-tasks web` serves this API (the `web` extra), with its OpenAPI document at "
        "`/openapi.json` and an interactive page at `/docs`. A token is sent as "
        "`Authorization: Bearer TOKEN` (`SAGA_API_TOKENS`); errors are "
        "`application/problem+json`. The [trust model](../guides/security.md) says what each "
        "scope may see and do. The document below is the example app's: a path's saga type "
        "is one of your app's.\n",
    ]
    errors = _errors(document)
    if errors:
        lines += [
            "Every route may answer, as a problem document:\n",
            "| status | when |",
            "|---|---|",
        ]
        lines += [f"| {code} | {_cell(text)} |" for code, text in errors.items()]
        lines.append("")
    models: list[str] = []
    for path, item in document.get("paths", {}).items():
        for method, op in item.items():
            verb = method.upper()
            scope = scopes.get((verb, path))
            lines.append(f"## `{verb} {path}`\n")
            lines.append(
                f"**{op.get('summary', '')}**. Scope: " + (f"`{scope}`." if scope else "none.")
            )
            lines.append("")
            if op.get("description"):
                lines += [str(op["description"]).replace("``", "`"), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required | default |", "|---|---|---|---|---|"]
                for p in params:
                    schema = p.get("schema", {})
                    default = f"`{schema['default']}`" if "default" in schema else ""
                    kind = _cell(_type(schema, components))
                    yes = "yes" if p.get("required") else "no"
                    lines.append(f"| `{p['name']}` | {p['in']} | {kind} | {yes} | {default} |")
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Body ({media}): {_type(content.get('schema', {}), components)}.", ""]
                models += [m for m in _refs(content) if m not in models]
            answers = [
                f"{code} {r.get('description', '')}"
                for code, r in op.get("responses", {}).items()
                if code not in errors
            ]
            lines += ["Answers: " + "; ".join(answers) + ".", ""]
    if models:
        lines += ["## Request bodies\n"]
        seen: list[str] = []
        while models:
            name = models.pop(0)
            if name in seen:
                continue
            seen.append(name)
            lines += _model(name, components)
            models += [m for m in _refs(components.get(name, {})) if m not in seen]
    return "\n".join(lines).rstrip("\n") + "\n"


def _errors(document: dict[str, Any]) -> dict[str, str]:
    """The error answers every operation declares alike (listed once, not per route)."""
    shared: dict[str, str] | None = None
    for item in document.get("paths", {}).values():
        for op in item.values():
            codes = {
                code: str(r.get("description", ""))
                for code, r in op.get("responses", {}).items()
                if code[0] in "45"
            }
            shared = codes if shared is None else {c: t for c, t in shared.items() if c in codes}
    return shared or {}


def _openapi() -> dict[str, Any]:
    from participants.app import saga_app
    from saga_tasks.web import create_web_app

    return create_web_app(saga_app).openapi()


# -- the command ----------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "commands.md": commands_page,
    "settings.md": settings_page,
    "http-api.md": http_api_page,
}


def stale() -> list[str]:
    """The reference pages whose committed text differs from what the code writes."""
    return [
        name
        for name, page in PAGES.items()
        if not (REFERENCE / name).exists() or (REFERENCE / name).read_text() != page()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which pages differ")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            click.echo(f"docs/reference/{name} differs from the code: run {RUN}", err=True)
        return 1 if names else 0
    for name, page in PAGES.items():
        (REFERENCE / name).write_text(page())
        click.echo(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
