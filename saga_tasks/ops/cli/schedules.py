"""``saga-tasks schedules``: the app's schedules, their next tick and their last run."""

from __future__ import annotations

from typing import Any

import click

from saga_tasks.ops.cli.base import Context, emit, errors


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def schedules(obj: Context, as_json: bool) -> None:
    """List the sagas started on a schedule: saga type, cron or interval, next run, and
    the last run (tick, saga and its status, or why it started none)."""
    from saga_tasks.ops.views import schedules_view

    app = obj.app()
    with errors():
        view = schedules_view(app)
    emit(view, as_json, render_schedules)


def render_schedules(v: dict[str, Any]) -> None:
    if not v["schedules"]:
        click.echo("no schedules (SagaApp(schedules=[...]))")
    for s in v["schedules"]:
        click.echo(f"{s['name']}  {s['saga_type']}  {s['schedule']}  next {s['next_run']}")
        run = s["last_run"]
        if run is None:
            click.echo("  last run  -")
        elif run["saga_id"]:
            again = f"  fired {run['firings']} times" if run["firings"] > 1 else ""
            click.echo(
                f"  last run  {run['tick']}  saga {run['saga_id']} ({run['saga_status']}){again}"
            )
        else:
            click.echo(f"  last run  {run['tick']}  no saga: {run['error']}")
        error = s["last_error"]
        if error is not None and error != run:
            click.echo(f"  last error  {error['tick']}  {error['error']}")
