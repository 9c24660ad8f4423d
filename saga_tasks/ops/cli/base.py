"""What every command shares: exit codes, errors as one line, the app named by --app."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from saga_tasks.config import Settings
from saga_tasks.errors import (
    ConfigurationError,
    InputError,
    SagaOverloaded,
    SagaTasksError,
    ServiceUnavailable,
)
from saga_tasks.observability.logs import printable

EXIT_CONFIG = 1
EXIT_INPUT = 2
EXIT_UNAVAILABLE = 3
EXIT_OVERLOADED = 4
"""Admission control refused a start: nothing was started; try again later."""

COMMANDS_GROUP = "saga_tasks.commands"
"""Entry-point group of the commands other distributions add to ``saga-tasks``."""


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then the exit code: never a stack trace."""
    click.echo(f"error: {printable(message)}", err=True)
    sys.exit(code)


@contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except InputError as exc:
        fail(str(exc), EXIT_INPUT)
    except ServiceUnavailable as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except SagaOverloaded as exc:
        fail(f"{exc} (retry after {exc.retry_after} s)", EXIT_OVERLOADED)
    except ConfigurationError as exc:
        fail(str(exc), EXIT_CONFIG)
    except SagaTasksError as exc:
        fail(str(exc), EXIT_CONFIG)


class Context:
    """The ``--app`` given, and the app and settings loaded only when a command asks."""

    def __init__(self, app_spec: str | None, *, named: bool = False) -> None:
        self.app_spec = app_spec
        self.named = named
        """``--app`` was given on the command line (not only ``SAGA_TASKS_APP``)."""
        self._app: Any = None

    @property
    def settings(self) -> Settings:
        with errors():
            return Settings.from_env()

    def reader(self) -> Any:
        """For a command that only reads the saga tables: the app when it is loaded or
        named with ``--app``; otherwise, with ``SAGA_DATABASE_URL`` set, a ``Reader`` on
        the environment's settings (the ones ``SAGA_TASKS_APP``'s app takes from there
        too), which imports none of the deployment."""
        if self._app is not None or self.named or not os.environ.get("SAGA_DATABASE_URL"):
            return self.app()
        from saga_tasks.ops.reader import Reader

        return Reader(self.settings)

    def app(self) -> Any:
        if self._app is None:
            from saga_tasks.app import load_app

            with errors():
                self._app = load_app(self.app_spec or self.settings.app)
        return self._app


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """JSON (which escapes control characters itself), or text with every string that
    came from outside escaped before it reaches the terminal."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(_printable(data))


def _printable(data: Any) -> Any:
    if isinstance(data, str):
        return printable(data)
    if isinstance(data, dict):
        return {_printable(k): _printable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_printable(v) for v in data]
    return data
