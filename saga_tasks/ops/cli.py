"""``saga-tasks``: start, inspect and list sagas; migrate the schema; declare the topology.

Exit codes: 0 success, 1 configuration problem, 2 bad input (malformed JSON, unknown
saga type or id, invalid payload), 3 a backing service cannot be reached. Errors are
one line on stderr, never a stack trace.

Other distributions add commands through the entry-point group ``saga_tasks.commands``,
each entry a ``click.Command``. A command is imported only when it is run or listed by
``--help``; one that cannot be imported is an error naming it, with exit code 1.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
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

COMMANDS_GROUP = "saga_tasks.commands"
"""Entry-point group of the commands other distributions add to ``saga-tasks``."""


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


@functools.cache
def _plugins() -> dict[str, EntryPoint]:
    """The commands installed distributions add, by name; nothing is imported yet."""
    return {entry.name: entry for entry in entry_points(group=COMMANDS_GROUP)}


def _load(entry: EntryPoint) -> click.Command:
    try:
        command = entry.load()
    except Exception as exc:  # noqa: BLE001 - a plugin's import may fail in any way
        return _broken(entry, f"{type(exc).__name__}: {exc}")
    if not isinstance(command, click.Command):
        return _broken(entry, f"{entry.value} is not a click command")
    return command


def _broken(entry: EntryPoint, why: str) -> click.Command:
    """A stand-in that lists in ``--help`` and, when run, fails naming the plugin."""
    origin = f"entry point {entry.value}" + (f" of {entry.dist.name}" if entry.dist else "")

    def fail() -> None:
        _fail(f"the command {entry.name!r} cannot be loaded ({origin}): {why}", EXIT_CONFIG)

    return click.Command(
        entry.name,
        callback=fail,
        short_help="(cannot be loaded; run it to see why)",
        context_settings={
            "ignore_unknown_options": True,
            "allow_extra_args": True,
            "help_option_names": [],
        },
    )


class _Commands(click.Group):
    """The built-in commands, then those of plugins (``saga_tasks.commands``), loaded only
    when run or listed. A built-in command keeps its name against a plugin's."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry = _plugins().get(cmd_name)
        return None if entry is None else _load(entry)

    def invoke(self, ctx: click.Context) -> Any:
        # A plugin's command speaks the CLI's exit codes without importing this module.
        with _errors():
            return super().invoke(ctx)


@click.group(cls=_Commands)
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
    """Apply every migration: the saga schema's, then the app's (safe to run again, and
    concurrently). Without --app or SAGA_TASKS_APP, the saga schema's only."""
    from saga_tasks.ops import services

    url, migrations = _migration_target(obj)
    with _errors():
        if create and services.ensure_database(url):
            click.echo("created the database")
        revisions = services.upgrade(url, migrations)
    for name, revision in revisions:
        click.echo(f"{name} at revision {revision}")
    if not obj.app_spec:
        click.echo("no app named (--app or SAGA_TASKS_APP): the saga schema only", err=True)


@db.command("current")
@click.pass_obj
def db_current(obj: _Context) -> None:
    """Print each chain's revision: the saga schema's, then the app's."""
    from saga_tasks.ops import services

    url, migrations = _migration_target(obj)
    with _errors():
        revisions = services.current_revisions(url, migrations)
    for name, revision in revisions:
        click.echo(f"{name} {revision}")


def _migration_target(obj: _Context) -> tuple[str, tuple[str, ...]]:
    """The database and the app's chains; an app only when one is named explicitly, so
    that the saga schema can be migrated where no app is installed yet."""
    if not obj.app_spec:
        return obj.settings.database_url, ()
    app = obj.app()
    return app.settings.database_url, tuple(app.migrations)


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
    if v.get("held_messages"):
        click.echo("\nheld messages (saga-tasks dlq|parking show ID)")
        for m in v["held_messages"]:
            step = m["step"] or "-"
            click.echo(
                f"  {m['id']:>6}  {m['holding']:<11} {m['status']:<9} {step:<18} {m['reason']}"
            )
    click.echo("\nhistory")
    for h in v["history"]:
        step = f" [{h['step']}]" if h["step"] else ""
        change = ""
        if h["step_status_before"] != h["step_status_after"]:
            change = f" {h['step_status_before']} -> {h['step_status_after']}"
        reason = f" - {h['reason']}" if h["reason"] else ""
        actor = f" ({h['actor']})" if h["actor"] != "system" else ""
        click.echo(f"  {h['at']}  {h['event']}{step}{change}{actor}{reason}")


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
    from saga_tasks.core.states import saga_status
    from saga_tasks.ops.views import list_view

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


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.pass_obj
def web(obj: _Context, host: str, port: int) -> None:
    """Serve the HTTP API, /metrics and the dashboard."""
    import uvicorn

    from saga_tasks.observability.logs import configure_logging
    from saga_tasks.web import create_web_app

    app = obj.app()
    configure_logging(app.settings)  # SAGA_LOG_FORMAT and SAGA_LOG_LEVEL, as workers do
    with _errors():
        web_app = create_web_app(app)
    click.echo(f"saga_tasks web on http://{host}:{port} (API docs at /docs)")
    uvicorn.run(web_app, host=host, port=port, log_level="info", access_log=False)


# -- operators ------------------------------------------------------------------------------


def _operator_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--json", "as_json", is_flag=True, help="Print the saga as JSON.")(fn)
    fn = click.option(
        "--expect-version",
        type=int,
        required=True,
        help="The saga version you decided on (see show); a newer one refuses the action.",
    )(fn)
    fn = click.option("--reason", required=True, help="Why; written to the saga's history.")(fn)
    return click.option("--actor", required=True, help="Who acts; written to the saga's history.")(
        fn
    )


def _act(obj: _Context, saga_id: str, verb: str, as_json: bool, **kw: Any) -> None:
    from saga_tasks.ops.operator import act

    app = obj.app()
    with _errors():
        view = act(app, saga_id, verb, **kw)
    _emit(view, as_json, _render_saga)


@main.command("retry-step")
@click.argument("saga_id")
@click.argument("step")
@_operator_options
@click.pass_obj
def retry_step(
    obj: _Context,
    *,
    saga_id: str,
    step: str,
    actor: str,
    reason: str,
    expect_version: int,
    as_json: bool,
) -> None:
    """Send a step's command (or its compensation) again, same command id."""
    _act(obj, saga_id, "retry_step", as_json, actor=actor, reason=reason,
         expect_version=expect_version, step=step)  # fmt: skip


@main.command("skip-step")
@click.argument("saga_id")
@click.argument("step")
@_operator_options
@click.pass_obj
def skip_step(
    obj: _Context,
    *,
    saga_id: str,
    step: str,
    actor: str,
    reason: str,
    expect_version: int,
    as_json: bool,
) -> None:
    """Mark a step done (or its compensation done) by hand, and go on."""
    _act(obj, saga_id, "skip_step", as_json, actor=actor, reason=reason,
         expect_version=expect_version, step=step)  # fmt: skip


@main.command("compensate")
@click.argument("saga_id")
@_operator_options
@click.pass_obj
def compensate(
    obj: _Context, *, saga_id: str, actor: str, reason: str, expect_version: int, as_json: bool
) -> None:
    """Compensate a running saga, or one in manual review."""
    _act(obj, saga_id, "compensate", as_json, actor=actor, reason=reason,
         expect_version=expect_version)  # fmt: skip


@main.command("resolve")
@click.argument("saga_id")
@click.option(
    "--status",
    "resolution",
    required=True,
    type=click.Choice(["COMPLETED", "COMPENSATED", "FAILED"], case_sensitive=False),
)
@_operator_options
@click.pass_obj
def resolve(
    obj: _Context,
    *,
    saga_id: str,
    resolution: str,
    actor: str,
    reason: str,
    expect_version: int,
    as_json: bool,
) -> None:
    """Close a saga in MANUAL_REVIEW with a final status."""
    _act(obj, saga_id, "resolve", as_json, actor=actor, reason=reason,
         expect_version=expect_version, resolution=resolution)  # fmt: skip


@main.command()
@click.option("--older-than", type=float, help="Seconds without change (default SAGA_STUCK_AFTER).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def stuck(obj: _Context, older_than: float | None, limit: int, as_json: bool) -> None:
    """Active sagas that have not moved for a while, oldest first."""
    from saga_tasks.ops.views import stuck as find_stuck

    app = obj.app()
    with _errors():
        view = find_stuck(app, older_than=older_than, limit=limit)

    def render(v: dict[str, Any]) -> None:
        if not v["stuck"]:
            click.echo(f"no saga has been idle for {v['older_than_seconds']:.0f} s")
        for s in v["stuck"]:
            click.echo(
                f"{s['saga_id']}  {s['status']:<13} v{s['version']:<3} "
                f"idle {s['idle_seconds']:>8.0f} s  {s['saga_type']} {s['business_key']}"
            )

    _emit(view, as_json, render)


def _held_group(holding: str, name: str, title: str) -> click.Group:
    @click.group(name=name, help=title)
    def group() -> None:
        pass

    @group.command("list")
    @click.option(
        "--status",
        default="pending",
        show_default=True,
        type=click.Choice(["pending", "replayed", "discarded", "all"]),
    )
    @click.option("--saga", "saga_id", help="Only this saga's messages.")
    @click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @click.pass_obj
    def list_held(
        obj: _Context, status: str, saga_id: str | None, limit: int, as_json: bool
    ) -> None:
        """Held messages, newest first."""
        from saga_tasks.ops.views import held_list

        app = obj.app()
        with _errors():
            view = held_list(
                app,
                holding,
                status=None if status == "all" else status,
                saga_id=saga_id,
                limit=limit,
            )

        def render(v: dict[str, Any]) -> None:
            if not v["messages"]:
                click.echo("nothing held")
            for m in v["messages"]:
                click.echo(
                    f"{m['id']:>6}  {m['status']:<9} {m['received_at']}  "
                    f"{m['task_name'] or '-':<22} {m['step'] or '-':<18} {m['reason']}"
                )

        _emit(view, as_json, render)

    @group.command("show")
    @click.argument("held_id", type=int)
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @click.pass_obj
    def show_held(obj: _Context, held_id: int, as_json: bool) -> None:
        """One held message, with the checks a replay would run now."""
        from saga_tasks.ops.views import held_show

        app = obj.app()
        with _errors():
            view = held_show(app, held_id)

        def render(v: dict[str, Any]) -> None:
            keys = (
                "id", "holding", "status", "reason", "saga_id", "step", "kind", "task_name",
                "message_id", "original_queue", "death_count", "first_death_at",
                "last_death_at", "received_at", "resolved_by", "resolution",
            )  # fmt: skip
            for key in keys:
                click.echo(f"{key:<16} {v[key]}")
            click.echo("replay checks")
            for c in v["replay_checks"]:
                mark = "BLOCKS" if c["blocks"] else "ok"
                click.echo(f"  {mark:<7} {c['check']:<12} {c['finding']}")

        _emit(view, as_json, render)

    @group.command("replay")
    @click.argument("held_id", type=int)
    @click.option("--actor", required=True, help="Who replays; written to the saga's history.")
    @click.option("--reason", required=True, help="Why; written to the saga's history.")
    @click.option("--force", is_flag=True, help="Replay although a check blocks it.")
    @click.option("--force-reason", help="Why forcing is right (required with --force).")
    @click.option("--expect-version", type=int, help="The saga's version you decided on.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @click.pass_obj
    def replay_held(
        obj: _Context,
        *,
        held_id: int,
        actor: str,
        reason: str,
        force: bool,
        force_reason: str | None,
        expect_version: int | None,
        as_json: bool,
    ) -> None:
        """Publish a held message again to its queue, if the checks allow it."""

        app = obj.app()
        with _errors():
            result = app.replayer.replay(
                held_id,
                actor=actor,
                reason=reason,
                force=force,
                force_reason=force_reason,
                expect_version=expect_version,
            )
        data = {
            "id": result.held_id,
            "replayed": result.replayed,
            "forced": result.forced,
            "checks": [
                {"check": c.name, "finding": c.finding, "blocks": c.blocks} for c in result.checks
            ],
        }

        def render(d: dict[str, Any]) -> None:
            click.echo(f"replayed held message {d['id']}" + (" (forced)" if d["forced"] else ""))

        _emit(data, as_json, render)

    @group.command("discard")
    @click.argument("held_id", type=int)
    @click.option("--actor", required=True, help="Who discards; written to the saga's history.")
    @click.option("--reason", required=True, help="Why; written to the saga's history.")
    @click.pass_obj
    def discard_held(obj: _Context, held_id: int, actor: str, reason: str) -> None:
        """Close a held message without sending it."""

        app = obj.app()
        with _errors():
            app.replayer.discard(held_id, actor=actor, reason=reason)
        click.echo(f"discarded held message {held_id}")

    return group


main.add_command(_held_group("dead_letter", "dlq", "Messages taken off the dead-letter queue."))
main.add_command(_held_group("parking", "parking", "Messages taken off the parking lot."))


if __name__ == "__main__":  # pragma: no cover
    main()
