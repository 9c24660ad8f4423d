"""``saga-tasks``: start, inspect and list sagas; migrate the schema; declare the topology.

Exit codes: 0 success, 1 configuration problem, 2 bad input (malformed JSON, unknown
saga type or id, invalid payload), 3 a backing service cannot be reached. Errors are
one line on stderr, never a stack trace.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from saga_tasks.config import Settings
from saga_tasks.errors import (
    ConfigurationError,
    InputError,
    SagaTasksError,
    ServiceUnavailable,
)

EXIT_CONFIG = 1
EXIT_INPUT = 2
EXIT_UNAVAILABLE = 3


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except InputError as exc:
        _fail(str(exc), EXIT_INPUT)
    except ServiceUnavailable as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_CONFIG)
    except SagaTasksError as exc:
        _fail(str(exc), EXIT_CONFIG)


class _Context:
    def __init__(self, app_spec: str | None) -> None:
        self.app_spec = app_spec
        self._app: Any = None

    @property
    def settings(self) -> Settings:
        with _errors():
            return Settings.from_env()

    def app(self) -> Any:
        if self._app is None:
            from saga_tasks.app import load_app

            with _errors():
                self._app = load_app(self.app_spec or self.settings.app)
        return self._app


def _emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(data)


@click.group()
@click.option("--app", "app_spec", envvar="SAGA_TASKS_APP", help="module:attribute of the SagaApp.")
@click.pass_context
def main(ctx: click.Context, app_spec: str | None) -> None:
    """Saga orchestration on Celery, RabbitMQ and PostgreSQL."""
    ctx.obj = _Context(app_spec)


# -- services -------------------------------------------------------------------------------


@main.command()
@click.pass_obj
def check(obj: _Context) -> None:
    """Check that PostgreSQL, RabbitMQ and Redis answer."""
    from saga_tasks.ops import services

    settings = obj.settings
    with _errors():
        services.check_all(settings)
    click.echo("PostgreSQL, RabbitMQ and Redis answer")


@main.group()
def db() -> None:
    """The database schema."""


@db.command("upgrade")
@click.option("--create/--no-create", default=True, help="Create the database if it is missing.")
@click.pass_obj
def db_upgrade(obj: _Context, create: bool) -> None:
    """Apply every migration (safe to run again, and concurrently)."""
    from saga_tasks.ops import services

    url = obj.settings.database_url
    with _errors():
        if create and services.ensure_database(url):
            click.echo("created the database")
        revision = services.upgrade(url)
    click.echo(f"schema at revision {revision}")


@db.command("current")
@click.pass_obj
def db_current(obj: _Context) -> None:
    """Print the schema's revision."""
    from saga_tasks.ops import services

    with _errors():
        click.echo(services.current_revision(obj.settings.database_url) or "none")


@main.group()
def broker() -> None:
    """The RabbitMQ topology."""


@broker.command("declare")
@click.pass_obj
def broker_declare(obj: _Context) -> None:
    """Declare every exchange and queue (idempotent; reports argument drift)."""
    from saga_tasks.messaging.topology import declare_topology

    app = obj.app()
    with _errors():
        names = declare_topology(app.settings.broker_url, app.topology)
    click.echo(f"declared {len(names)} queues: {', '.join(names)}")


# -- sagas ----------------------------------------------------------------------------------


@main.command()
@click.argument("saga_type")
@click.option(
    "--key", "business_key", required=True, help="Business key; one saga per type and key."
)
@click.option("--payload", required=True, help="The payload, a JSON object.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def start(obj: _Context, saga_type: str, business_key: str, payload: str, as_json: bool) -> None:
    """Start a saga (or show the one already started for KEY)."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        _fail(
            f"--payload is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            EXIT_INPUT,
        )
    app = obj.app()
    from saga_tasks.ops import services
    from saga_tasks.persistence.db import check_database

    with _errors():
        app.registry.latest(saga_type)
        check_database(app.settings.database_url)
        services.check_broker(app.settings.broker_url)
        handle = app.start_saga(saga_type, business_key, data)
    result = {
        "saga_id": handle.saga_id,
        "saga_type": handle.saga_type,
        "business_key": handle.business_key,
        "status": handle.status.value,
        "created": handle.created,
    }
    _emit(
        result,
        as_json,
        lambda r: click.echo(
            f"{'started' if r['created'] else 'already started'} {r['saga_type']} saga "
            f"{r['saga_id']} ({r['status']})"
        ),
    )


@main.command()
@click.argument("saga_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(obj: _Context, saga_id: str, as_json: bool) -> None:
    """Show one saga: status, steps and history."""
    from saga_tasks.ops.views import saga_view

    app = obj.app()
    with _errors():
        view = saga_view(app, saga_id)
    _emit(view, as_json, _render_saga)


def _render_saga(v: dict[str, Any]) -> None:
    click.echo(f"saga      {v['saga_id']}")
    click.echo(f"type      {v['saga_type']} v{v['definition_version']}   key {v['business_key']}")
    reason = f"   ({v['status_reason']})" if v["status_reason"] else ""
    click.echo(f"status    {v['status']}{reason}   version {v['version']}")
    click.echo(f"created   {v['created_at']}   finished {v['finished_at'] or '-'}")
    click.echo("\nsteps")
    for s in v["steps"]:
        error = f"  {s['last_error']}" if s["last_error"] else ""
        click.echo(f"  {s['step']:<24} {s['status']:<22} attempt {s['attempt']}{error}")
    click.echo("\nhistory")
    for h in v["history"]:
        step = f" [{h['step']}]" if h["step"] else ""
        change = ""
        if h["step_status_before"] != h["step_status_after"]:
            change = f" {h['step_status_before']} -> {h['step_status_after']}"
        reason = f" - {h['reason']}" if h["reason"] else ""
        click.echo(f"  {h['at']}  {h['event']}{step}{change}{reason}")


@main.command("list")
@click.option(
    "--status", help="RUNNING, COMPENSATING, COMPLETED, COMPENSATED, MANUAL_REVIEW or FAILED."
)
@click.option("--type", "saga_type", help="Only sagas of this type.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(
    obj: _Context, status: str | None, saga_type: str | None, limit: int, as_json: bool
) -> None:
    """List recent sagas, newest first."""
    from saga_tasks.ops.views import list_view
    from saga_tasks.states import saga_status

    parsed = None
    if status is not None:
        try:
            parsed = saga_status(status)
        except ValueError as exc:
            _fail(str(exc), EXIT_INPUT)
    app = obj.app()
    if saga_type is not None:
        with _errors():
            app.registry.latest(saga_type)
    with _errors():
        view = list_view(app, status=parsed, saga_type=saga_type, limit=limit)

    def render(v: dict[str, Any]) -> None:
        if not v["sagas"]:
            click.echo("no sagas")
        for s in v["sagas"]:
            click.echo(
                f"{s['saga_id']}  {s['saga_type']:<10} {s['status']:<14} v{s['version']:<3} "
                f"{s['created_at']}  {s['business_key']}"
            )

    _emit(view, as_json, render)


@main.command()
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def invalid(obj: _Context, limit: int, as_json: bool) -> None:
    """List messages that made no sense to a consumer, newest first."""
    from saga_tasks.ops.views import invalid_view

    app = obj.app()
    with _errors():
        view = invalid_view(app, limit=limit)

    def render(v: dict[str, Any]) -> None:
        if not v["invalid_messages"]:
            click.echo("no invalid messages")
        for m in v["invalid_messages"]:
            click.echo(
                f"{m['received_at']}  {m['consumer']:<22} {m['message_id'] or '-'}  {m['reason']}"
            )

    _emit(view, as_json, render)


@main.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    }
)
@click.pass_context
def chaos(ctx: click.Context) -> None:
    """Run order sagas under injected faults and random SIGKILLs, then check invariants.

    Options: --sagas N --seconds S --kill-every S --json --here --keep (see --help).
    """
    try:
        from participants.chaos import main as chaos_main
    except ImportError as exc:
        _fail(f"the chaos run needs the example participants: {exc}", EXIT_CONFIG)
    with _errors():
        sys.exit(chaos_main(ctx.args))


if __name__ == "__main__":  # pragma: no cover
    main()
