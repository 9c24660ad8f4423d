"""What must hold once every saga of a deployment has ended, checked against its tables.

``check_invariants`` returns every broken invariant as one line (empty: all hold):

- every saga ended: COMPLETED, COMPENSATED or FAILED, or MANUAL_REVIEW with a reason;
- a COMPLETED saga's steps all succeeded; a COMPENSATED saga has no step succeeded or
  still out;
- the history explains every saga: it starts with ``saga_started``, records how the
  saga reached its status, every operator entry names its actor and reason, and no
  reply was taken as conflicting (a participant's ledger answers each command id
  once, always the same way, so a conflict is the orchestrator misreading an answer);
- every outbox is empty of unpublished rows, and every command or compensation the
  saga state says was requested has its outbox row;
- nothing published was lost: every reply a participant published reached the
  orchestrator, and every command published reached its participant's ledger (or was
  dead-lettered, parked or recorded as invalid, and so is on record);
- with ``effects``, each step's business effect agrees with its status: a succeeded
  step's effect is there, a compensated, failed or never-sent step's is not, counting
  what operators did by hand (a step skipped while it was sent or unsent is done by
  hand, so the participant must not have done it too; a compensation skipped is
  undone by hand, so its effect is not looked for).

Each question is asked of the database that holds the answer: the saga tables of the
orchestrator's (``engine``), a participant's tables of its own (``participant_engine``;
by default the same one); what spans two databases is compared here.

Call it once the queues are empty (a message still queued is not lost) and the
workers idle. ``operator_accounting`` checks a list of accepted operator actions
against the history; ``evidence`` prints sagas as an incident review reads them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine

from saga_tasks.participant import Participant
from saga_tasks.persistence import audit

EngineOf = Callable[[str], Engine]
"""A participant's engine by participant name."""

Effects = Callable[[EngineOf, Sequence[str]], Mapping[str, Mapping[str, bool]]]
"""Reads the participants' own tables: for each of the given saga ids, whether each
step's business effect is there (a step missing from the mapping is not checked)."""

FINAL_EVENT = {
    "COMPLETED": "saga_completed",
    "COMPENSATED": "saga_compensated",
    "MANUAL_REVIEW": "manual_review",
    "FAILED": "saga_resolved",
}
EXPECT_PRESENT = ("SUCCEEDED", "COMPENSATION_SKIPPED")
EXPECT_ABSENT = ("COMPENSATED", "FAILED", "PENDING", "SKIPPED")
SENT_OR_UNSENT = ("REQUESTED", "PENDING")


@dataclass
class ByHand:
    """What operators did to one step, from the history (the last entry wins)."""

    done_from: str | None = None
    """The step's status when an operator marked it done by hand (skip-step)."""
    done_by: str | None = None
    undone_by: str | None = None
    """An operator marked its compensation done by hand."""


@dataclass
class Report:
    """The violations found, and how many sagas ended in each status."""

    violations: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    by_hand: dict[tuple[str, str], ByHand] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def check_invariants(
    engine: Engine,
    participants: Sequence[Participant],
    *,
    participant_engine: EngineOf | None = None,
    effects: Effects | None = None,
    lost: bool = True,
) -> Report:
    """Every broken invariant of the deployment's sagas (see the module docstring);
    ``lost=False`` leaves out the lost-message checks (``lost_messages`` runs them alone)."""
    engine_of = participant_engine or (lambda _name: engine)
    report = Report()
    found = report.violations
    with engine.connect() as conn:
        report.statuses = audit.status_counts(conn)
        found += [f"saga {s} is still {status}" for s, status in audit.unfinished(conn)]
        found += [f"saga {s} is in MANUAL_REVIEW without a reason" for s in
                  audit.review_without_reason(conn)]  # fmt: skip
        report.by_hand = _by_hand(conn)
        steps = audit.step_statuses(conn)
        found += _statuses_agree(steps)
        if effects is not None:
            saga_ids = sorted({saga_id for saga_id, *_ in steps})
            found += _effects_agree(steps, effects(engine_of, saga_ids), report.by_hand)
        found += _history(conn)
        found += _outboxes(conn, participants, engine_of)
    if lost:
        found += lost_messages(engine, participants, participant_engine=participant_engine)
    return report


def lost_messages(
    engine: Engine,
    participants: Sequence[Participant],
    *,
    participant_engine: EngineOf | None = None,
) -> list[str]:
    """Published messages that never reached their consumer and are on no record (run it
    once the queues are empty: a message still queued is not lost)."""
    engine_of = participant_engine or (lambda _name: engine)
    with engine.connect() as conn:
        applied = audit.applied_replies(conn)
        on_record = audit.on_record(conn)
        commands = audit.published(conn, "saga")
        purged = audit.purged(conn)  # their inbox went with them; nothing was lost
    found = []
    for p in participants:
        with engine_of(p.name).connect() as conn:
            replies = audit.published(conn, p.schema)
            ledger = audit.claimed(conn, p.schema)
        found += [
            f"saga {s}: a reply of {t} from {p.name} ({m}) was published and never "
            "reached the orchestrator"
            for s, m, t, _q, _c in replies
            if m not in applied and m not in on_record and str(s) not in purged
        ]
        found += [
            f"saga {s}: command {m} ({t}) was published and never reached {p.name}"
            for s, m, t, queue, command_id in commands
            if queue == p.queue and command_id not in ledger and m not in on_record
        ]
    return found


def _by_hand(conn: Connection) -> dict[tuple[str, str], ByHand]:
    found: dict[tuple[str, str], ByHand] = defaultdict(ByHand)
    for saga_id, step, event, actor, before in audit.by_hand(conn):
        fact = found[(saga_id, step)]
        if event == "step_succeeded":
            fact.done_from, fact.done_by = before, actor
        else:
            fact.undone_by = actor
    return dict(found)


def undone_by_hand(hand: Mapping[tuple[str, str], ByHand], saga_id: str, step: str) -> bool:
    fact = hand.get((saga_id, step))
    return fact is not None and fact.undone_by is not None


def _statuses_agree(steps: Iterable[tuple[str, str, str, str]]) -> list[str]:
    found = []
    for saga_id, saga_status, step, status in steps:
        if saga_status == "COMPLETED" and status != "SUCCEEDED":
            found.append(f"saga {saga_id} is COMPLETED but step {step} is {status}")
        if saga_status == "COMPENSATED" and status in (
            "SUCCEEDED",
            "REQUESTED",
            "COMPENSATING",
            "COMPENSATION_FAILED",
        ):
            found.append(f"saga {saga_id} is COMPENSATED but step {step} is {status}")
    return found


def _effects_agree(
    steps: Iterable[tuple[str, str, str, str]],
    effects: Mapping[str, Mapping[str, bool]],
    hand: Mapping[tuple[str, str], ByHand],
) -> list[str]:
    found = []
    for saga_id, _, step, status in steps:
        present = effects.get(saga_id, {}).get(step)
        if present is None:
            continue
        fact = hand.get((saga_id, step), ByHand())
        if status in EXPECT_PRESENT:
            if fact.done_by is not None:
                if fact.done_from in SENT_OR_UNSENT and present:
                    found.append(
                        f"saga {saga_id}: step {step} was done by hand ({fact.done_by}, "
                        f"skipped while {fact.done_from}) and by its participant as well"
                    )
            elif not present:
                found.append(f"saga {saga_id}: step {step} is {status} but its effect is missing")
        elif status in EXPECT_ABSENT and present:
            if status == "COMPENSATED" and fact.undone_by is not None:
                continue
            found.append(f"saga {saga_id}: step {step} is {status} but its effect is there")
    return found


def _history(conn: Connection) -> list[str]:
    found = []
    for saga_id, status, first, events in audit.history_bounds(conn):
        if first != "saga_started":
            found.append(f"saga {saga_id}: history does not start with saga_started")
        wanted = FINAL_EVENT.get(status)
        if wanted and wanted not in events:
            found.append(f"saga {saga_id} is {status} but its history has no {wanted}")
    found += [
        f"saga {saga_id}: a reply of step {step} was taken as conflicting ({reason}), "
        "yet no participant contradicts itself"
        for saga_id, step, reason in audit.conflicting_replies(conn)
    ]
    found += [
        f"saga {saga_id}: history entry {event} by {actor!r} lacks actor or reason"
        for saga_id, event, actor in audit.unsigned_operator_entries(conn)
    ]
    return found


def _outboxes(
    conn: Connection, participants: Sequence[Participant], engine_of: EngineOf
) -> list[str]:
    found = []
    left = {"saga": audit.unpublished(conn, "saga")}
    for p in participants:
        with engine_of(p.name).connect() as own:
            left[p.schema] = audit.unpublished(own, p.schema)
    found += [
        f"{n} messages never published from {schema}.outbox" for schema, n in left.items() if n
    ]
    found += [
        f"saga {saga_id}: step {step}'s {which} {command_id} was requested but has no outbox row"
        for saga_id, step, which, command_id in audit.requested_without_outbox_row(conn)
    ]
    return found


@dataclass(frozen=True)
class Done:
    """An operator action that was accepted, as whoever took it recorded it."""

    saga_id: str
    verb: str
    actor: str
    step: str | None = None


def operator_accounting(engine: Engine, done: Iterable[Done]) -> list[str]:
    """Every accepted operator action is in its saga's history, with its actor."""
    wanted: dict[tuple[str, str, str], int] = defaultdict(int)
    for d in done:
        wanted[(d.saga_id, f"operator_{d.verb}", d.actor)] += 1
    if not wanted:
        return []
    with engine.connect() as conn:
        have = audit.operator_entries(conn, sorted({k[0] for k in wanted}))
    return [
        f"saga {saga_id}: {n} {event} by {actor} done, {have.get((saga_id, event, actor), 0)} "
        "in its history"
        for (saga_id, event, actor), n in sorted(wanted.items())
        if have.get((saga_id, event, actor), 0) < n
    ]


def saga_ids_in(lines: Iterable[str]) -> list[str]:
    """The saga ids the violation lines name, in order, each once."""
    found: dict[str, None] = {}
    for line in lines:
        for m in re.finditer(r"saga ([0-9a-f]{8}-[0-9a-f-]{27})", line):
            found.setdefault(m.group(1), None)
    return list(found)


def evidence(engine: Engine, saga_ids: Iterable[str], limit: int = 10) -> dict[str, list[str]]:
    """Each saga as an incident review reads it: status, steps, then its history."""
    found: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for saga_id in list(saga_ids)[:limit]:
            head, steps, history = audit.step_evidence(conn, saga_id)
            if head is None:
                continue
            lines = [
                f"{head.business_key} {head.status} v{head.version} "
                f"(reason: {head.status_reason}; next_wake_at {head.next_wake_at})"
            ]
            lines += [
                f"step {r.step}: {r.status} attempt {r.attempt}/{r.compensation_attempt} "
                f"gen {r.generation} command {r.command_id} compensation {r.compensation_id}"
                for r in steps
            ]
            lines += [
                f"{r.at:%H:%M:%S.%f} {r.event} {r.step or '-'} "
                f"{r.status_before}->{r.status_after} "
                f"{r.step_status_before or ''}->{r.step_status_after or ''} "
                f"[{r.actor}] {r.reason or ''}".rstrip()
                for r in history
            ]
            found[saga_id] = lines
    return found
