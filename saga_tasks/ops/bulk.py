"""One operator verb on every saga a filter selects, by incident: counted first (a dry
run), then acted on saga by saga, each in its own transaction with the row that says the
incident reached it, so a run killed at any instant and run again under the same name
continues and never acts twice on a saga.

Each action is the decider's, as for one saga (what it refuses is recorded as refused,
with its reason, and the run goes on); its reason carries the incident's name into the
saga's history. Commands an action sends go through flow control like any other, so a
participant with a limit gets them at its pace; ``rate`` paces the run itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from saga_tasks.app import SagaApp
from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.errors import (
    ActionRefused,
    InputError,
    SagaNotFound,
    UnknownDefinitionVersion,
    UnknownSagaType,
)
from saga_tasks.persistence import bulk
from saga_tasks.persistence.bulk import Selection
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import saga_outbox

VERBS: dict[str, OperatorVerb] = {
    "retry-step": OperatorVerb.RETRY_STEP,
    "skip-step": OperatorVerb.SKIP_STEP,
    "cancel": OperatorVerb.COMPENSATE,
    "compensate": OperatorVerb.COMPENSATE,
    "resolve": OperatorVerb.RESOLVE,
}
"""The verbs a bulk run takes (``cancel`` is ``compensate``: it undoes what was done)."""
BATCH = 100


@dataclass
class Progress:
    """Where a run is: the sagas it reached by outcome (this run and before), of ``total``
    selected when it began, and how fast this run goes."""

    incident: str
    total: int
    accepted: int = 0
    refused: int = 0
    moved: int = 0
    """Selected when their batch was read, out of the selection when locked: left alone."""
    this_run: int = 0
    started: float = field(default_factory=time.monotonic)
    refusals: list[tuple[str, str]] = field(default_factory=list)
    """(saga id, reason) of the first few refused in this run, for the report."""

    @property
    def done(self) -> int:
        return self.accepted + self.refused + self.moved

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.this_run / elapsed if elapsed > 0 else 0.0

    def view(self) -> dict[str, Any]:
        return {
            "incident": self.incident,
            "selected": self.total,
            "accepted": self.accepted,
            "refused": self.refused,
            "moved": self.moved,
            "this_run": self.this_run,
            "per_second": round(self.rate, 1),
            "refusals": [{"saga_id": s, "reason": r} for s, r in self.refusals],
        }


class _Reached(Exception):
    """Another run of the incident reached the saga first: this action rolls back."""


def dry_run(app: SagaApp, selection: Selection, *, sample: int = 10) -> dict[str, Any]:
    """How many sagas the selection holds now, and the first few."""
    with translated(app.settings.database_url), app.engine.connect() as conn:
        return {
            "count": bulk.count(conn, selection),
            "sample": bulk.sample(conn, selection, sample),
            "selection": selection.document(),
        }


def run(
    app: SagaApp,
    incident: str,
    verb: str,
    selection: Selection,
    *,
    actor: str,
    reason: str,
    step: str | None = None,
    resolution: str | None = None,
    rate: float | None = None,
    on_progress: Callable[[Progress], None] = lambda _p: None,
) -> Progress:
    """Act with ``verb`` on each saga of ``selection`` the incident has not reached."""
    action = _action(verb, actor=actor, reason=reason, step=step, resolution=resolution)
    _known_step(app, selection, step)
    options = {"step": step, "resolution": action.resolution}
    clock = app.clock
    url = app.settings.database_url
    asked = bulk.Run(
        incident=incident,
        verb=verb,
        selection=selection.document(),
        options=options,
        actor=action.actor,
        reason=action.reason,
        started_at=clock.now(),
        finished_at=None,
    )
    with translated(url), app.engine.begin() as conn:
        found = bulk.begin(conn, asked)
        counts = bulk.tally(conn, incident)
    _same_run(found, asked)
    # An incident is about the sagas there were when it began: one started since (or
    # after a run finished, when the incident is run again) is not part of it.
    if selection.created_before is None or selection.created_before > found.started_at:
        selection = dataclasses.replace(selection, created_before=found.started_at)
    progress = Progress(
        incident, 0, counts[bulk.ACCEPTED], counts[bulk.REFUSED], counts[bulk.MOVED]
    )
    said = dataclasses.replace(action, reason=f"{action.reason} [incident {incident}]")
    while True:
        with translated(url), app.engine.connect() as conn:
            batch = bulk.pending(conn, incident, selection, BATCH)
            # Sagas leave the selection while the run goes (an operator, a reply): the
            # total is what was reached and what is still to reach.
            progress.total = progress.done + bulk.count_pending(conn, incident, selection)
        on_progress(progress)
        if not batch:
            break
        for saga_id in batch:
            _one(app, incident, saga_id, said, selection=selection, progress=progress)
            on_progress(progress)
            if rate:
                _pace(progress, rate)
    with translated(url), app.engine.begin() as conn:
        bulk.finish(conn, incident, clock.now())
    return progress


def _one(
    app: SagaApp,
    incident: str,
    saga_id: str,
    action: OperatorAction,
    *,
    selection: Selection,
    progress: Progress,
) -> None:
    """Act on one saga, if the selection still holds it once its row is locked (it may
    have moved since its batch was read: left alone then, as ``moved``)."""
    url = app.settings.database_url
    now = app.clock.now()
    try:
        with translated(url), app.engine.begin() as conn:
            if not bulk.lock_if_selected(conn, saga_id, selection):
                if bulk.reached(conn, incident, saga_id, outcome=bulk.MOVED, now=now):
                    progress.moved += 1
                    progress.this_run += 1
                return
            # The row first: a run of the same incident that got here first has it, and
            # this one then does nothing (no decision, no log line, no metric).
            if not bulk.reached(conn, incident, saga_id, outcome=bulk.ACCEPTED, now=now):
                raise _Reached
            messages, _after = app.orchestrator.act_in(conn, saga_id, action, expect_version=None)
    except _Reached:
        return
    except (ActionRefused, SagaNotFound, UnknownDefinitionVersion, UnknownSagaType) as refused:
        # What stops this saga, not the run: the decider's refusal, or a definition this
        # process does not load (the saga is left for a process that does).
        with translated(url), app.engine.begin() as conn:
            if bulk.reached(
                conn,
                incident,
                saga_id,
                outcome=bulk.REFUSED,
                detail=str(refused),
                now=app.clock.now(),
            ):
                progress.refused += 1
                progress.this_run += 1
                if len(progress.refusals) < 10:
                    progress.refusals.append((saga_id, str(refused)))
        return
    app.outlet.send(saga_outbox, messages)
    progress.accepted += 1
    progress.this_run += 1


def _pace(progress: Progress, rate: float) -> None:
    """Sleep so this run acts on at most ``rate`` sagas a second."""
    ahead = progress.this_run / rate - (time.monotonic() - progress.started)
    if ahead > 0:
        time.sleep(ahead)


def _action(
    verb: str, *, actor: str, reason: str, step: str | None, resolution: str | None
) -> OperatorAction:
    if verb not in VERBS:
        raise InputError(f"bulk takes {', '.join(VERBS)}, not {verb!r}")
    if not actor.strip() or not reason.strip():
        raise InputError("a bulk action needs --actor and --reason")
    if verb in ("retry-step", "skip-step") and not step:
        raise InputError(f"bulk {verb} needs --step")
    finals = ("COMPLETED", "COMPENSATED", "FAILED")
    if verb == "resolve" and (not resolution or resolution.upper() not in finals):
        raise InputError(f"bulk resolve needs --to, one of {', '.join(finals)}")
    return OperatorAction(
        verb=VERBS[verb],
        actor=actor.strip(),
        reason=reason.strip(),
        step=step,
        resolution=resolution.upper() if resolution else None,
    )


def _known_step(app: SagaApp, selection: Selection, step: str | None) -> None:
    """Refuse, before the incident is begun, a step no loaded definition (of the
    selected type) has: every saga would refuse it, and the name would be spent."""
    if step is None:
        return
    definitions = [d for d in app.registry if selection.saga_type in (None, d.saga_type)]
    if not any(step in d.by_name for d in definitions):
        known = sorted({n for d in definitions for n in d.by_name})
        raise InputError(f"no saga definition loaded here has a step {step!r} ({', '.join(known)})")


def _same_run(found: bulk.Run, asked: bulk.Run) -> None:
    """Running an incident again continues it: with its verb, filter and options, or not
    at all (another action under its name would mix two incidents)."""
    mine = (asked.verb, asked.selection, asked.options)
    theirs = (found.verb, found.selection, found.options)
    if mine != theirs:
        raise InputError(
            f"incident {asked.incident!r} was a bulk {found.verb} of {found.selection} "
            f"({found.options}), started by {found.actor} at {found.started_at:%Y-%m-%d %H:%M}; "
            "run it again as it was, or name a new incident"
        )
