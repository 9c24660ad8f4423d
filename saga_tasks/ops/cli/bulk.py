"""``saga-tasks bulk VERB``: one operator verb on every saga a filter selects, by incident;
``saga-tasks purge``: finished sagas past their retention."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import click

from saga_tasks.ops.cli.base import Context, emit, errors

VERB_NAMES = ("retry-step", "skip-step", "cancel", "compensate", "resolve")


class _Every:
    """Says where the run is at most once a second, and at the end (on stderr)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, progress: Any, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < 1.0:
            return
        self.last = now
        click.echo(
            f"incident {progress.incident}: {progress.done}/{progress.total} "
            f"(accepted {progress.accepted}, refused {progress.refused}, moved {progress.moved}), "
            f"{progress.rate:.1f}/s",
            err=True,
        )


@click.command("bulk")
@click.argument("verb", type=click.Choice(VERB_NAMES))
@click.option("--incident", help="The incident's name: recorded with every action; run "
              "again with it to continue where a run stopped.")  # fmt: skip
@click.option("--actor", help="Who acts; written to each saga's history.")
@click.option("--reason", help="Why; written to each saga's history with the incident.")
@click.option("--step", help="The step, for retry-step and skip-step.")
@click.option("--to", "resolution", help="The final status, for resolve.")
@click.option("--type", "saga_type", help="Only sagas of this type.")
@click.option("--status", help="Only sagas in this status (e.g. MANUAL_REVIEW).")
@click.option("--definition-version", type=int, help="Only sagas of this definition version.")
@click.option("--since", type=click.DateTime(), help="Only sagas created at or after (UTC).")
@click.option("--until", type=click.DateTime(), help="Only sagas created before (UTC).")
@click.option("--key-prefix", help="Only sagas whose business key starts so.")
@click.option("--error", help="Only sagas whose reason or a step's last error holds this text.")
@click.option("--dry-run", is_flag=True, help="Count and show the first ones; change nothing.")
@click.option("--rate", type=click.FloatRange(min=0.1), help="At most this many sagas a second.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def bulk(obj: Context, *, verb: str, incident: str | None, actor: str | None,
         reason: str | None, step: str | None, resolution: str | None, saga_type: str | None,
         status: str | None, definition_version: int | None, since: datetime | None,
         until: datetime | None, key_prefix: str | None, error: str | None, dry_run: bool,
         rate: float | None, as_json: bool) -> None:  # fmt: skip
    """Act with VERB on every saga the filters select, saga by saga, each action the
    decider's (what it refuses is counted, with its reason). Killed and run again with
    the same --incident, it continues and never acts twice on a saga. Commands it sends
    go through flow control; --rate paces the run. cancel is compensate."""
    from saga_tasks.core.states import saga_status
    from saga_tasks.errors import InputError
    from saga_tasks.ops import bulk as runner
    from saga_tasks.persistence.bulk import Selection

    app = obj.app()
    with errors():
        if status is not None:
            try:
                status = saga_status(status).value
            except ValueError as exc:
                raise InputError(str(exc)) from None
        selection = Selection(
            saga_type=saga_type,
            status=status,
            definition_version=definition_version,
            created_after=_utc(since),
            created_before=_utc(until),
            key_prefix=key_prefix,
            error=error,
        )
        if dry_run:
            emit(runner.dry_run(app, selection), as_json, _render_dry)
            return
        if not incident or not actor or not reason:
            raise InputError("bulk needs --incident, --actor and --reason (or --dry-run)")
        say = _Every()
        done = runner.run(
            app,
            incident,
            verb,
            selection,
            actor=actor,
            reason=reason,
            step=step,
            resolution=resolution,
            rate=rate,
            on_progress=say,
        )
        say(done, final=True)
    emit(done.view(), as_json, _render_done)


def _utc(at: datetime | None) -> datetime | None:
    from datetime import UTC

    return None if at is None else at.replace(tzinfo=at.tzinfo or UTC)


def _render_dry(v: dict[str, Any]) -> None:
    click.echo(f"{v['count']} sagas selected ({v['selection'] or 'no filter'})")
    for s in v["sample"]:
        click.echo(
            f"  {s['saga_id']}  {s['saga_type']:<12} {s['status']:<14} {s['business_key']}"
            f"  {s['status_reason'] or ''}"
        )


def _render_done(v: dict[str, Any]) -> None:
    click.echo(
        f"incident {v['incident']}: {v['accepted']} accepted, {v['refused']} refused, "
        f"{v['moved']} moved out of the selection "
        f"of {v['selected']} ({v['this_run']} in this run, {v['per_second']}/s)"
    )
    for r in v["refusals"]:
        click.echo(f"  refused {r['saga_id']}: {r['reason']}")


@click.command("purge")
@click.option("--finished-before", type=click.DateTime(),
              help="Purge sagas that finished before this (UTC) [default: the retention ago, "
              "SAGA_RETENTION_DAYS].")  # fmt: skip
@click.option("--type", "saga_type", help="Only sagas of this type.")
@click.option("--dry-run", is_flag=True, help="Count what would be purged; change nothing.")
@click.option("--force", is_flag=True,
              help="Purge sagas finished within SAGA_REPLAY_MAX_AGE too (their held messages "
              "could still be replayed).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def purge(
    obj: Context,
    *,
    finished_before: datetime | None,
    saga_type: str | None,
    dry_run: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Purge finished sagas (COMPLETED, COMPENSATED, FAILED) with their steps, history and
    held messages, a batch per transaction (SAGA_PURGE_BATCH), each leaving a tombstone so
    its id answers "purged". Active sagas, sagas in review, and any still owing a message
    or holding one a person has not settled are never purged. Beat's housekeeping does
    this on its own after SAGA_RETENTION_DAYS."""
    from datetime import UTC, timedelta

    from saga_tasks.errors import InputError
    from saga_tasks.persistence import purge as purging
    from saga_tasks.persistence.db import translated

    app = obj.app()
    with errors():
        if finished_before is None:
            if app.settings.retention_days <= 0:
                raise InputError("SAGA_RETENTION_DAYS is 0 (kept forever): give --finished-before")
            before = app.clock.now() - timedelta(days=app.settings.retention_days)
        else:
            before = finished_before.replace(tzinfo=finished_before.tzinfo or UTC)
        horizon = app.clock.now() - timedelta(seconds=app.settings.replay_max_age)
        if before > horizon and not force:
            raise InputError(
                f"--finished-before {before:%Y-%m-%d %H:%M} is within SAGA_REPLAY_MAX_AGE "
                f"({app.settings.replay_max_age:g} s): a held message of such a saga could "
                f"still be replayed; give {horizon:%Y-%m-%d %H:%M} or earlier, or --force"
            )
        with translated(app.settings.database_url), app.engine.connect() as conn:
            due, oldest = purging.due(conn, before=before, saga_type=saga_type)
        view: dict[str, Any] = {
            "finished_before": before.isoformat(),
            "saga_type": saga_type,
            "due": due,
            "oldest_finished_at": oldest.isoformat() if oldest is not None else None,
        }
        if not dry_run:

            def said(purged: int) -> None:
                click.echo(f"purged {purged} of {due}", err=True)

            view["purged"] = app.maintenance.purge_finished(
                before=before, saga_type=saga_type, budget=float("inf"), on_batch=said
            )
    emit(view, as_json, _render_purge)


def _render_purge(v: dict[str, Any]) -> None:
    what = f"{v['due']} sagas finished before {v['finished_before']}"
    if v["saga_type"]:
        what += f" of type {v['saga_type']}"
    if "purged" in v:
        click.echo(f"purged {v['purged']} ({what} were due)")
    else:
        click.echo(f"would purge {what} (oldest finished {v['oldest_finished_at'] or '-'})")
