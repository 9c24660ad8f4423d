"""Commands other distributions add through the entry-point group ``saga_tasks.commands``."""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

from saga_tasks.ops.cli.base import EXIT_CONFIG, errors, fail

COMMANDS_GROUP = "saga_tasks.commands"
"""Entry-point group of the commands other distributions add to ``saga-tasks``."""

EDGES = {"web": "saga_tasks.web.cli:web"}
"""Built-in commands that live with the edge they serve (an import from ``ops`` would
point upwards): found by name, loaded like a plugin when run or listed."""


def edge(name: str) -> EntryPoint | None:
    """The built-in command ``name`` of an edge, as an entry point (nothing imported)."""
    where = EDGES.get(name)
    return None if where is None else EntryPoint(name, where, COMMANDS_GROUP)


@functools.cache
def find() -> dict[str, EntryPoint]:
    """The commands installed distributions add, by name; nothing is imported yet."""
    return {entry.name: entry for entry in entry_points(group=COMMANDS_GROUP)}


def load(entry: EntryPoint) -> click.Command:
    try:
        command = entry.load()
    except Exception as exc:  # noqa: BLE001 - a plugin's import may fail in any way
        return broken(entry, f"{type(exc).__name__}: {exc}")
    if not isinstance(command, click.Command):
        return broken(entry, f"{entry.value} is not a click command")
    return command


def broken(entry: EntryPoint, why: str) -> click.Command:
    """A stand-in that lists in ``--help`` and, when run, fails naming the plugin."""
    dist = getattr(entry, "dist", None)
    origin = f"entry point {entry.value}" + (f" of {dist.name}" if dist else "")

    def refuse() -> None:
        fail(f"the command {entry.name!r} cannot be loaded ({origin}): {why}", EXIT_CONFIG)

    return click.Command(
        entry.name,
        callback=refuse,
        short_help="(cannot be loaded; run it to see why)",
        context_settings={
            "ignore_unknown_options": True,
            "allow_extra_args": True,
            "help_option_names": [],
        },
    )


class Commands(click.Group):
    """The built-in commands (those of the edges, ``EDGES``, loaded when run or listed),
    then those of plugins (``saga_tasks.commands``), loaded likewise. A built-in command
    keeps its name against a plugin's."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *EDGES, *find()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry = edge(cmd_name) or find().get(cmd_name)
        return None if entry is None else load(entry)

    def invoke(self, ctx: click.Context) -> Any:
        # A plugin's command speaks the CLI's exit codes without importing this module.
        with errors():
            return super().invoke(ctx)
