"""Dead letters and parked messages taken into the database: list, show, replay, discard."""

from __future__ import annotations

from typing import Any

import click

from saga_tasks.ops.cli.base import (
    Context,
    emit,
    errors,
)

HOLDING = "saga_tasks.holding"
"""``click`` context meta key: which holding the running group (dlq, parking) lists."""


def _holding() -> str:
    return str(click.get_current_context().meta[HOLDING])


@click.command("list")
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
def list_held(obj: Context, status: str, saga_id: str | None, limit: int, as_json: bool) -> None:
    """Held messages, newest first."""
    from saga_tasks.ops.views import held_list

    app = obj.app()
    with errors():
        view = held_list(
            app,
            _holding(),
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

    emit(view, as_json, render)


@click.command("show")
@click.argument("held_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show_held(obj: Context, held_id: int, as_json: bool) -> None:
    """One held message, with the checks a replay would run now."""
    from saga_tasks.ops.views import held_show

    app = obj.app()
    with errors():
        view = held_show(app, held_id)

    def render(v: dict[str, Any]) -> None:
        keys = (
            "id", "holding", "status", "reason", "saga_id", "step", "kind", "task_name",
            "message_id", "original_queue", "death_count", "first_death_at",
            "last_death_at", "received_at", "resolved_by", "resolution", "published_by",
        )  # fmt: skip
        for key in keys:
            click.echo(f"{key:<16} {v[key]}")
        if v["attested"]:
            click.echo(f"{'attested':<16} yes")
        else:
            click.echo(
                f"{'attested':<16} NO: not dead-lettered by the broker from a service's "
                "message, nor held by a service that may speak for its step. Its reason "
                "is the publisher's claim; it moved no saga."
            )
        click.echo("replay checks")
        for c in v["replay_checks"]:
            mark = "BLOCKS" if c["blocks"] else "ok"
            click.echo(f"  {mark:<7} {c['check']:<12} {c['finding']}")

    emit(view, as_json, render)


@click.command("replay")
@click.argument("held_id", type=int)
@click.option("--actor", required=True, help="Who replays; written to the saga's history.")
@click.option("--reason", required=True, help="Why; written to the saga's history.")
@click.option("--force", is_flag=True, help="Replay although a check blocks it.")
@click.option("--force-reason", help="Why forcing is right (required with --force).")
@click.option("--expect-version", type=int, help="The saga's version you decided on.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def replay_held(
    obj: Context,
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
    with errors():
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

    emit(data, as_json, render)


@click.command("discard")
@click.argument("held_id", type=int)
@click.option("--actor", required=True, help="Who discards; written to the saga's history.")
@click.option("--reason", required=True, help="Why; written to the saga's history.")
@click.pass_obj
def discard_held(obj: Context, held_id: int, actor: str, reason: str) -> None:
    """Close a held message without sending it."""

    app = obj.app()
    with errors():
        app.replayer.discard(held_id, actor=actor, reason=reason)
    click.echo(f"discarded held message {held_id}")


@click.group("dlq")
@click.pass_context
def dlq(ctx: click.Context) -> None:
    """Messages taken off the dead-letter queue."""
    ctx.meta[HOLDING] = "dead_letter"


@click.group("parking")
@click.pass_context
def parking(ctx: click.Context) -> None:
    """Messages taken off the parking lot."""
    ctx.meta[HOLDING] = "parking"


for _group in (dlq, parking):
    for _command in (list_held, show_held, replay_held, discard_held):
        _group.add_command(_command)
