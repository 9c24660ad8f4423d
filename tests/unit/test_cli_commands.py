"""Commands other distributions add to ``saga-tasks`` (entry points in
``saga_tasks.commands``): listed, run with the CLI's exit codes, and a broken one named."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint

import click
import pytest
from click.testing import CliRunner

from saga_tasks.errors import InputError
from saga_tasks.ops import cli


@click.command()
@click.option("--times", type=int, default=1)
def hello(times: int) -> None:
    """Say hello."""
    click.echo("hello " * times)


@click.command()
def rejects() -> None:
    """Refuse its input."""
    raise InputError("no such thing")


NOT_A_COMMAND = "not a command"


def _entry(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=cli.COMMANDS_GROUP)


@pytest.fixture
def plugins(monkeypatch):
    here = __name__
    found = {
        "hello": _entry("hello", f"{here}:hello"),
        "rejects": _entry("rejects", f"{here}:rejects"),
        "missing": _entry("missing", "no_such_module_anywhere:command"),
        "odd": _entry("odd", f"{here}:NOT_A_COMMAND"),
        "list": _entry("list", f"{here}:hello"),
    }
    monkeypatch.setattr(cli.plugins, "find", lambda: found)
    return found


def test_a_plugin_command_is_listed_and_runs(plugins):
    runner = CliRunner()
    listed = runner.invoke(cli.main, ["--help"])
    assert listed.exit_code == 0
    assert "hello" in listed.output and "Say hello." in listed.output
    ran = runner.invoke(cli.main, ["hello", "--times", "2"])
    assert ran.exit_code == 0 and ran.output.strip() == "hello hello"


def test_a_plugin_speaks_the_cli_exit_codes(plugins):
    result = CliRunner().invoke(cli.main, ["rejects"])
    assert result.exit_code == cli.EXIT_INPUT
    assert result.stderr.strip() == "error: no such thing"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("missing", "(entry point no_such_module_anywhere:command): ModuleNotFoundError: "),
        ("odd", f"{__name__}:NOT_A_COMMAND is not a click command"),
    ],
)
def test_a_broken_plugin_is_named_and_exits_with_the_config_code(plugins, name, why):
    runner = CliRunner()
    listed = runner.invoke(cli.main, ["--help"])
    assert listed.exit_code == 0 and name in listed.output
    result = runner.invoke(cli.main, [name, "--whatever"])
    assert result.exit_code == cli.EXIT_CONFIG
    assert result.stderr.startswith(f"error: the command {name!r} ")
    assert why in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_plugin_cannot_take_a_built_in_name(plugins):
    result = CliRunner().invoke(cli.main, ["list", "--help"])
    assert result.exit_code == 0 and "List recent sagas" in result.output


def test_the_tools_add_bench_chaos_and_demo_with_their_own_options():
    for name, option in (("bench", "--unloaded"), ("chaos", "--kill-every"), ("demo", "--rate")):
        result = subprocess.run(
            [sys.executable, "-m", "saga_tasks.ops.cli", name, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: saga-tasks {name} ")
        assert option in result.stdout
