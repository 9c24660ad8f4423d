"""Operator actions on sagas, each with an actor, a reason and the version looked at."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from saga_tasks.ops.cli.base import (
    EXIT_INPUT,
    Context,
    emit,
    errors,
    fail,
)
from saga_tasks.ops.cli.sagas import render_saga


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


def _act(obj: Context, saga_id: str, verb: str, as_json: bool, **kw: Any) -> None:
    from saga_tasks.ops.operator import act

    app = obj.app()
    with errors():
        view = act(app, saga_id, verb, **kw)
    emit(view, as_json, render_saga)


@click.command("retry-step")
@click.argument("saga_id")
@click.argument("step")
@_operator_options
@click.pass_obj
def retry_step(
    obj: Context,
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


@click.command("skip-step")
@click.argument("saga_id")
@click.argument("step")
@_operator_options
@click.pass_obj
def skip_step(
    obj: Context,
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


@click.command("compensate")
@click.argument("saga_id")
@_operator_options
@click.pass_obj
def compensate(
    obj: Context, *, saga_id: str, actor: str, reason: str, expect_version: int, as_json: bool
) -> None:
    """Compensate a running saga, or one in manual review."""
    _act(obj, saga_id, "compensate", as_json, actor=actor, reason=reason,
         expect_version=expect_version)  # fmt: skip


cancel = click.Command(
    "cancel",
    params=compensate.params,
    callback=compensate.callback,
    help="Cancel a running saga, or one in manual review: compensate it (what it did is "
    "undone, step by step). The same as compensate.",
)


@click.command("resolve")
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
    obj: Context,
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


@click.command("migrate")
@click.argument("saga_id")
@click.option(
    "--to-version",
    type=click.IntRange(min=1),
    required=True,
    help="The definition version to move to; this process must load it.",
)
@click.option("--actor", required=True, help="Who acts; written to the saga's history.")
@click.option("--reason", required=True, help="Why; written to the saga's history.")
@click.option(
    "--expect-version",
    type=int,
    help="The saga version you decided on (see show); a newer one refuses the migration.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the saga as JSON.")
@click.pass_obj
def migrate(
    obj: Context,
    *,
    saga_id: str,
    to_version: int,
    actor: str,
    reason: str,
    expect_version: int | None,
    as_json: bool,
) -> None:
    """Move a saga to another version of its definition (every step it began unchanged)."""
    from saga_tasks.ops.operator import migrate as migrate_saga

    app = obj.app()
    with errors():
        view = migrate_saga(app, saga_id, to_version, actor=actor, reason=reason,
                            expect_version=expect_version)  # fmt: skip
    emit(view, as_json, render_saga)


@click.command()
@click.option("--older-than", type=float, help="Seconds without change (default SAGA_STUCK_AFTER).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def stuck(obj: Context, older_than: float | None, limit: int, as_json: bool) -> None:
    """Active sagas that have not moved for a while, oldest first."""
    from saga_tasks.ops.views import stuck as find_stuck

    with errors():
        view = find_stuck(obj.reader(), older_than=older_than, limit=limit)

    def render(v: dict[str, Any]) -> None:
        if not v["stuck"]:
            click.echo(f"no saga has been idle for {v['older_than_seconds']:.0f} s")
        for s in v["stuck"]:
            click.echo(
                f"{s['saga_id']}  {s['status']:<13} v{s['version']:<3} "
                f"idle {s['idle_seconds']:>8.0f} s  {s['saga_type']} {s['business_key']}"
            )

    emit(view, as_json, render)


@click.command("signal")
@click.argument("saga_id")
@click.argument("step")
@click.option("--data", "data_json", required=True, help="The decision, a JSON object.")
@click.option("--actor", required=True, help="Who decides; written to the saga's history.")
@click.option("--reason", required=True, help="Why; written to the saga's history.")
@click.option(
    "--expect-version", type=int, default=None, help="Refuse if the saga moved since (see show)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the saga as JSON.")
@click.pass_obj
def signal(
    obj: Context,
    *,
    saga_id: str,
    step: str,
    data_json: str,
    actor: str,
    reason: str,
    expect_version: int | None,
    as_json: bool,
) -> None:
    """Answer a human step: its data, checked against the step's schema, becomes the
    step's result. Bad data exits 2 and changes nothing."""
    import json

    from saga_tasks.ops.operator import signal as give_signal

    try:
        data = json.loads(data_json)
    except ValueError as exc:
        fail(f"--data is not JSON: {exc}", EXIT_INPUT)
    app = obj.app()
    with errors():
        view = give_signal(app, saga_id, step, data, actor=actor, reason=reason,
                           expect_version=expect_version)  # fmt: skip
    emit(view, as_json, render_saga)
