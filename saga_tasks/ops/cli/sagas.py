"""Starting, showing and listing sagas, and the messages that made no sense."""

from __future__ import annotations

import json
from typing import Any

import click

from saga_tasks.ops.cli.base import (
    EXIT_INPUT,
    Context,
    emit,
    errors,
    fail,
)


@click.command()
@click.argument("saga_type")
@click.option(
    "--key", "business_key", required=True, help="Business key; one saga per type and key."
)
@click.option("--payload", required=True, help="The payload, a JSON object.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def start(obj: Context, saga_type: str, business_key: str, payload: str, as_json: bool) -> None:
    """Start a saga (or show the one already started for KEY)."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(
            f"--payload is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            EXIT_INPUT,
        )
    app = obj.app()
    from saga_tasks.ops import services
    from saga_tasks.persistence.db import check_database

    with errors():
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
    emit(
        result,
        as_json,
        lambda r: click.echo(
            f"{'started' if r['created'] else 'already started'} {r['saga_type']} saga "
            f"{r['saga_id']} ({r['status']})"
        ),
    )


@click.command()
@click.argument("saga_id")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="History lines to show, newest first.",
)
@click.option(
    "--before", type=click.IntRange(1, 2**62), help="Only history lines older than this id."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(obj: Context, saga_id: str, limit: int, before: int | None, as_json: bool) -> None:
    """Show one saga: status, steps, held messages and a page of its history, newest
    first (the command for the older page is printed under it)."""
    from saga_tasks.ops.views import saga_view

    reader = obj.reader()
    with errors():
        view = saga_view(reader, saga_id, history_limit=limit, history_before=before)
    emit(view, as_json, render_saga)


def render_saga(v: dict[str, Any]) -> None:
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
        counted = v["held_count"]
        shown = len(v["held_messages"])
        more = f", {shown} of {counted['total']} shown" if counted["total"] > shown else ""
        click.echo(
            f"\nheld messages: {counted['pending']} pending, {counted['not_attested']} not "
            f"attested{more} (saga-tasks dlq|parking list, show ID)"
        )
        for m in v["held_messages"]:
            step = m["step"] or "-"
            click.echo(
                f"  {m['id']:>6}  {m['holding']:<11} {m['status']:<9} {step:<18} {m['reason']}"
            )
    for n in v["notes"]:
        if n["dropped"]:
            click.echo(
                f"\nnotes     {n['event']}: {n['noted']}, the {n['dropped']} oldest dropped "
                f"(the newest kept), last {n['last_at']}"
            )
    click.echo("\nhistory (newest first)")
    for h in v["history"]:
        step = f" [{h['step']}]" if h["step"] else ""
        change = ""
        if h["step_status_before"] != h["step_status_after"]:
            change = f" {h['step_status_before']} -> {h['step_status_after']}"
        reason = f" - {h['reason']}" if h["reason"] else ""
        actor = f" ({h['actor']})" if h["actor"] != "system" else ""
        click.echo(f"  {h['id']:>8}  {h['at']}  {h['event']}{step}{change}{actor}{reason}")
    if v["history_next"] is not None:
        click.echo(f"\nolder: saga-tasks show {v['saga_id']} --before {v['history_next']}")


@click.command("list")
@click.option(
    "--status", help="RUNNING, COMPENSATING, COMPLETED, COMPENSATED, MANUAL_REVIEW or FAILED."
)
@click.option("--type", "saga_type", help="Only sagas of this type.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(
    obj: Context, status: str | None, saga_type: str | None, limit: int, as_json: bool
) -> None:
    """List recent sagas, newest first."""
    from saga_tasks.core.states import saga_status
    from saga_tasks.ops.views import list_view

    parsed = None
    if status is not None:
        try:
            parsed = saga_status(status)
        except ValueError as exc:
            fail(str(exc), EXIT_INPUT)
    if saga_type is not None:
        with errors():
            obj.app().registry.latest(saga_type)  # an unknown type is an error, not "none"
    with errors():
        view = list_view(obj.reader(), status=parsed, saga_type=saga_type, limit=limit)

    def render(v: dict[str, Any]) -> None:
        if not v["sagas"]:
            click.echo("no sagas")
            return
        # VERSION is the saga's row version, what --expect-version takes (not its
        # definition's version).
        click.echo(
            f"{'SAGA_ID':<36}  {'TYPE':<10} {'STATUS':<14} {'VERSION':<7} "
            f"{'CREATED':<32}  BUSINESS_KEY"
        )
        for s in v["sagas"]:
            click.echo(
                f"{s['saga_id']}  {s['saga_type']:<10} {s['status']:<14} {s['version']:<7} "
                f"{s['created_at']!s:<32}  {s['business_key']}"
            )

    emit(view, as_json, render)


@click.command()
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def invalid(obj: Context, limit: int, as_json: bool) -> None:
    """List messages that made no sense to a consumer, newest first."""
    from saga_tasks.ops.views import invalid_view

    app = obj.app()
    with errors():
        view = invalid_view(app, limit=limit)

    def render(v: dict[str, Any]) -> None:
        if not v["invalid_messages"]:
            click.echo("no invalid messages")
        for m in v["invalid_messages"]:
            click.echo(
                f"{m['received_at']}  {m['consumer']:<22} {m['message_id'] or '-'}  {m['reason']}"
            )

    emit(view, as_json, render)


@click.command()
@click.argument("saga_type")
@click.option("--version", "version", type=int, help="A version still loaded (default: newest).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def describe(obj: Context, saga_type: str, version: int | None, as_json: bool) -> None:
    """Describe a saga type: steps, dependencies, compensations, queues, timeouts,
    policies, and a Mermaid diagram."""
    from saga_tasks.ops.describe import describe as described

    app = obj.app()
    with errors():
        definition = (
            app.registry.latest(saga_type)
            if version is None
            else app.registry.get(saga_type, version)
        )
    found = described(definition)
    if not as_json:  # lines, each escaped alone: the diagram's own line breaks stay
        found = {**found, "mermaid": found["mermaid"].splitlines()}
    emit(found, as_json, render_definition)


def render_definition(d: dict[str, Any]) -> None:
    pivot = f"   pivot {d['pivot']}" if d.get("pivot") else ""
    click.echo(f"saga {d['saga_type']} v{d['version']}   timeout {d['timeout_seconds']:g} s{pivot}")
    for s in d["steps"]:
        after = ", ".join(s["depends_on"]) or "-"
        when = f"  when {s['when']}" if s.get("when") else ""
        human = s.get("human")
        if human:
            escalate = human["escalate_after_seconds"]
            click.echo(
                f"  {s['name']:<20} a person decides ({human['schema'] or 'any JSON object'})  "
                f"after {after:<20} within {human['decide_within_seconds']:g} s"
                + (f", alert after {escalate:g} s" if escalate else "")
                + f", then {human['on_timeout']}{when}"
            )
            continue
        undo = s["compensation"] or "cannot be undone"
        retry = s["retry"]
        click.echo(
            f"  {s['name']:<20} {s['action']:<24} undo {undo:<24} queue {s['queue']:<22} "
            f"after {after:<20} timeout {s['timeout_seconds']:g} s  "
            f"attempts {retry['max_attempts']} (x{retry['backoff']:g}, "
            f"up to {retry['max_interval_seconds']:g} s)  late {s['late_reply']}  "
            f"dead letter {s['on_dead_letter']}{'  PIVOT' if s.get('pivot') else ''}{when}"
        )
    click.echo("\n" + "\n".join(d["mermaid"]))
