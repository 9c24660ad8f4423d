"""What a chaos run must find in the database once every saga has ended.

``check_invariants`` reads the order saga's state and its three participants' tables
and returns every broken invariant as one line:

- every saga ended: COMPLETED, COMPENSATED or FAILED, or MANUAL_REVIEW with a reason;
- stock is conserved (each SKU's reserved count is what its held reservations hold)
  and each customer's open total is what their open authorizations hold;
- a participant's effect happens at most once per saga (one reservation, one
  authorization held), and each step's effect agrees with the step's status: a
  succeeded step's effect is there, a compensated, failed or never-sent step's is not;
- what an operator did counts: a step skipped while it was sent or not yet sent is
  done by hand, so the participant must not have done it as well; a compensation
  skipped is undone by hand, so its effect is not looked for; the history says who;
- only completed sagas (or sagas waiting for a person, or undone by hand) hold stock,
  a payment or a confirmed order;
- the history explains every saga: it starts with ``saga_started``, records how the
  saga reached its status, and every operator entry names its actor and reason; no
  reply is classified as conflicting (the run's participants never contradict
  themselves: a ledger answers each command id once, always the same way);
- a command the saga state says was sent has its outbox row (invariant 1), and no
  outbox row is left unpublished;
- nothing published was lost: every reply a participant published reached the
  orchestrator, and every command published reached its participant's ledger (or was
  dead-lettered or parked, and so is on record).

``operator_accounting`` checks the actions a run's operator took against the history.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

PARTICIPANTS = ("orders", "inventory", "payments")
SCHEMAS = ("saga", *PARTICIPANTS)
SYSTEM = "system"

FINAL_EVENT = {
    "COMPLETED": "saga_completed",
    "COMPENSATED": "saga_compensated",
    "MANUAL_REVIEW": "manual_review",
    "FAILED": "saga_resolved",
}


@dataclass(frozen=True)
class Effects:
    """What the participants hold for one saga."""

    reserved: int = 0
    authorized: int = 0
    order: str | None = None

    def present(self, step: str) -> bool | None:
        """Whether ``step``'s effect is there; None for a step this model does not know."""
        if step == "create_order":
            return self.order in ("PENDING", "CONFIRMED")
        if step == "reserve_stock":
            return self.reserved > 0
        if step == "authorize_payment":
            return self.authorized > 0
        if step == "confirm_order":
            return self.order == "CONFIRMED"
        return None


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


def _by_hand(conn: Connection) -> dict[tuple[str, str], ByHand]:
    found: dict[tuple[str, str], ByHand] = defaultdict(ByHand)
    rows = conn.execute(
        text(
            "SELECT saga_id::text, step, event, actor, step_status_before FROM saga.saga_history "
            "WHERE actor <> :system AND event IN ('step_succeeded', 'step_compensated') "
            "ORDER BY id"
        ),
        {"system": SYSTEM},
    )
    for saga_id, step, event, actor, before in rows:
        fact = found[(saga_id, step)]
        if event == "step_succeeded":
            fact.done_from, fact.done_by = before, actor
        else:
            fact.undone_by = actor
    return dict(found)


def _effects(conn: Connection) -> dict[str, Effects]:
    rows = conn.execute(
        text(
            """WITH r AS (SELECT saga_id, count(*) AS n FROM inventory.reservation
                          WHERE status = 'RESERVED' GROUP BY 1),
                    a AS (SELECT saga_id, count(*) AS n FROM payments.authorization
                          WHERE status = 'AUTHORIZED' GROUP BY 1)
               SELECT s.saga_id::text, coalesce(r.n, 0), coalesce(a.n, 0), o.status
               FROM saga.saga_instance s
               LEFT JOIN r ON r.saga_id = s.saga_id
               LEFT JOIN a ON a.saga_id = s.saga_id
               LEFT JOIN orders.orders o ON o.saga_id = s.saga_id"""
        )
    )
    return {r[0]: Effects(int(r[1]), int(r[2]), r[3]) for r in rows}


def check_invariants(engine: Any) -> tuple[list[str], dict[str, int]]:
    """Every broken invariant as one line, and the final status counts."""
    violations: list[str] = []
    with engine.connect() as conn:

        def q(sql: str, **params: Any) -> list[Any]:
            return list(conn.execute(text(sql), params))

        statuses = {
            r[0]: r[1] for r in q("SELECT status, count(*) FROM saga.saga_instance GROUP BY 1")
        }
        status_of = {r[0]: r[1] for r in q("SELECT saga_id::text, status FROM saga.saga_instance")}
        for saga_id, status in status_of.items():
            if status in ("RUNNING", "COMPENSATING"):
                violations.append(f"saga {saga_id} is still {status}")
        for (saga_id,) in q(
            "SELECT saga_id FROM saga.saga_instance WHERE status = 'MANUAL_REVIEW' "
            "AND coalesce(status_reason, '') = ''"
        ):
            violations.append(f"saga {saga_id} is in MANUAL_REVIEW without a reason")
        hand = _by_hand(conn)
        effects = _effects(conn)
        violations += _conservation(q)
        violations += _holders(q, hand)
        violations += _steps_agree(q, status_of, effects, hand)
        violations += _history(q)
        violations += _outboxes(q)
    return violations, statuses


def _undone_by_hand(hand: Mapping[tuple[str, str], ByHand], saga_id: str, step: str) -> bool:
    fact = hand.get((saga_id, step))
    return fact is not None and fact.undone_by is not None


def _conservation(q: Any) -> list[str]:
    found = []
    for sku, reserved, held in q(
        """SELECT s.sku, s.reserved, coalesce(sum((i->>'qty')::int), 0)
           FROM inventory.stock s
           LEFT JOIN inventory.reservation r ON r.status = 'RESERVED'
           LEFT JOIN LATERAL jsonb_array_elements(r.items) i ON i->>'sku' = s.sku
           GROUP BY s.sku, s.reserved HAVING s.reserved <> coalesce(sum((i->>'qty')::int), 0)"""
    ):
        found.append(f"stock of {sku}: {reserved} reserved, reservations hold {held}")
    for customer_id, total, held in q(
        """SELECT c.customer_id, c.authorized_cents, coalesce(sum(a.amount_cents), 0)
           FROM payments.customer c
           LEFT JOIN payments.authorization a
             ON a.customer_id = c.customer_id AND a.status = 'AUTHORIZED'
           GROUP BY c.customer_id, c.authorized_cents
           HAVING c.authorized_cents <> coalesce(sum(a.amount_cents), 0)"""
    ):
        found.append(
            f"customer {customer_id}: {total} cents authorized, open authorizations hold {held}"
        )
    for saga_id, n in q(
        """SELECT saga_id, count(*) FROM payments.authorization WHERE status = 'AUTHORIZED'
           GROUP BY saga_id HAVING count(*) > 1"""
    ):
        found.append(f"saga {saga_id} has {n} payments authorized")
    for saga_id, n in q(
        """SELECT saga_id, count(*) FROM inventory.reservation WHERE status = 'RESERVED'
           GROUP BY saga_id HAVING count(*) > 1"""
    ):
        found.append(f"saga {saga_id} has {n} reservations held")
    return found


def _holders(q: Any, hand: Mapping[tuple[str, str], ByHand]) -> list[str]:
    """Only completed sagas, sagas waiting for a person, or steps undone by hand hold
    stock, a payment or a confirmed order."""
    found = []
    keep = "('COMPLETED', 'MANUAL_REVIEW')"
    for saga_id, status in q(
        f"""SELECT DISTINCT r.saga_id::text, s.status FROM inventory.reservation r
            JOIN saga.saga_instance s USING (saga_id)
            WHERE r.status = 'RESERVED' AND s.status NOT IN {keep}"""  # noqa: S608
    ):
        if not _undone_by_hand(hand, saga_id, "reserve_stock"):
            found.append(f"saga {saga_id} is {status} but still holds stock")
    for saga_id, status in q(
        f"""SELECT DISTINCT a.saga_id::text, s.status FROM payments.authorization a
            JOIN saga.saga_instance s USING (saga_id)
            WHERE a.status = 'AUTHORIZED' AND s.status NOT IN {keep}"""  # noqa: S608
    ):
        if not _undone_by_hand(hand, saga_id, "authorize_payment"):
            found.append(f"saga {saga_id} is {status} but its payment is still authorized")
    for saga_id, status in q(
        f"""SELECT o.saga_id::text, s.status FROM orders.orders o
            JOIN saga.saga_instance s USING (saga_id)
            WHERE o.status = 'CONFIRMED' AND s.status NOT IN {keep}"""  # noqa: S608
    ):
        found.append(f"saga {saga_id} is {status} but its order is confirmed")
    return found


def _steps_agree(
    q: Any,
    status_of: Mapping[str, str],
    effects: Mapping[str, Effects],
    hand: Mapping[tuple[str, str], ByHand],
) -> list[str]:
    """Each step's effect agrees with its status, what operators did by hand counted."""
    found = []
    steps: dict[str, dict[str, str]] = defaultdict(dict)
    for saga_id, step, status in q("SELECT saga_id::text, step, status FROM saga.saga_step"):
        steps[saga_id][step] = status
    for saga_id, by_step in steps.items():
        saga_status = status_of.get(saga_id)
        eff = effects.get(saga_id, Effects())
        if saga_status == "COMPLETED":
            for step, status in by_step.items():
                if status != "SUCCEEDED":
                    found.append(f"saga {saga_id} is COMPLETED but step {step} is {status}")
        elif saga_status == "COMPENSATED":
            for step, status in by_step.items():
                if status in ("SUCCEEDED", "REQUESTED", "COMPENSATING", "COMPENSATION_FAILED"):
                    found.append(f"saga {saga_id} is COMPENSATED but step {step} is {status}")
        for step, status in by_step.items():
            present = eff.present(step)
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
                    found.append(
                        f"saga {saga_id}: step {step} is {status} but its effect is missing"
                    )
            elif status in EXPECT_ABSENT and present:
                if status == "COMPENSATED" and fact.undone_by is not None:
                    continue
                found.append(f"saga {saga_id}: step {step} is {status} but its effect is there")
    return found


def _history(q: Any) -> list[str]:
    found = []
    for saga_id, status, first, events in q(
        """SELECT s.saga_id, s.status,
                  (SELECT event FROM saga.saga_history h WHERE h.saga_id = s.saga_id
                   ORDER BY id LIMIT 1),
                  (SELECT array_agg(DISTINCT event) FROM saga.saga_history h
                   WHERE h.saga_id = s.saga_id)
           FROM saga.saga_instance s"""
    ):
        if first != "saga_started":
            found.append(f"saga {saga_id}: history does not start with saga_started")
        wanted = FINAL_EVENT.get(status)
        if wanted and wanted not in (events or []):
            found.append(f"saga {saga_id} is {status} but its history has no {wanted}")
    # The run's participants never contradict themselves (a ledger answers a command
    # once, the same way): a conflict is the orchestrator misreading an answer.
    for saga_id, step, reason in q(
        "SELECT saga_id, step, reason FROM saga.saga_history WHERE event = 'conflicting_reply'"
    ):
        found.append(
            f"saga {saga_id}: a reply of step {step} was taken as conflicting ({reason}), "
            "yet no participant contradicts itself"
        )
    for saga_id, event, actor in q(
        """SELECT saga_id, event, actor FROM saga.saga_history
           WHERE event LIKE 'operator%' AND (actor = :system OR coalesce(reason, '') = '')""",
        system=SYSTEM,
    ):
        found.append(f"saga {saga_id}: history entry {event} by {actor!r} lacks actor or reason")
    return found


def _outboxes(q: Any) -> list[str]:
    found = []
    for schema in SCHEMAS:
        ((left,),) = q(
            f"SELECT count(*) FROM {schema}.outbox WHERE published_at IS NULL"  # noqa: S608
        )
        if left:
            found.append(f"{left} messages never published from {schema}.outbox")
    # Invariant 1: a command the saga state says was requested has its outbox row.
    for saga_id, step, which, command_id in q(
        """SELECT st.saga_id, st.step, c.which, c.id FROM saga.saga_step st
           CROSS JOIN LATERAL (VALUES ('command', st.command_id),
                                      ('compensation', st.compensation_id)) AS c(which, id)
           WHERE c.id IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM saga.outbox o WHERE o.headers->>'saga_command_id' = c.id::text)"""
    ):
        found.append(
            f"saga {saga_id}: step {step}'s {which} {command_id} was requested "
            "but has no outbox row"
        )
    return found


def lost_messages(engine: Any) -> list[str]:
    """Published messages that never reached their consumer and are on no record.

    Run it once the queues are empty: a message still queued is not lost."""
    found = []
    on_record = """NOT EXISTS (SELECT 1 FROM saga.held_message h WHERE h.message_id = {id})
                   AND NOT EXISTS (SELECT 1 FROM saga.invalid_message v
                                   WHERE v.message_id = {id})"""
    with engine.connect() as conn:
        for schema in PARTICIPANTS:
            rows = conn.execute(
                text(
                    f"""SELECT o.saga_id, o.message_id, o.task_name FROM {schema}.outbox o
                        WHERE o.published_at IS NOT NULL
                        AND NOT EXISTS (SELECT 1 FROM saga.inbox i
                                        WHERE i.consumer = 'orchestrator'
                                        AND i.message_id = o.message_id::text)
                        AND {on_record.format(id="o.message_id::text")}"""  # noqa: S608
                )
            )
            found += [
                f"saga {s}: a reply of {t} from {schema} ({m}) was published and never "
                "reached the orchestrator"
                for s, m, t in rows
            ]
            rows = conn.execute(
                text(
                    f"""SELECT o.saga_id, o.message_id, o.task_name FROM saga.outbox o
                        WHERE o.published_at IS NOT NULL AND o.queue = :queue
                        AND NOT EXISTS (
                            SELECT 1 FROM {schema}.command_ledger l
                            WHERE l.command_id = (o.headers->>'saga_command_id')::uuid)
                        AND {on_record.format(id="o.message_id::text")}"""  # noqa: S608
                ),
                {"queue": f"{schema}.commands"},
            )
            found += [
                f"saga {s}: command {m} ({t}) was published and never reached {schema}"
                for s, m, t in rows
            ]
    return found


@dataclass(frozen=True)
class Done:
    """An operator action that was accepted, as the run's operator recorded it."""

    saga_id: str
    verb: str
    actor: str
    step: str | None = None


def operator_accounting(engine: Any, done: Iterable[Done]) -> list[str]:
    """Every accepted operator action is in its saga's history, with its actor."""
    wanted: dict[tuple[str, str, str], int] = defaultdict(int)
    for d in done:
        wanted[(d.saga_id, f"operator_{d.verb}", d.actor)] += 1
    if not wanted:
        return []
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT saga_id::text, event, actor, count(*) FROM saga.saga_history "
                "WHERE event LIKE 'operator%' AND saga_id = ANY(CAST(:ids AS uuid[])) "
                "GROUP BY 1, 2, 3"
            ),
            {"ids": sorted({k[0] for k in wanted})},
        )
        have = {(r[0], r[1], r[2]): int(r[3]) for r in rows}
    return [
        f"saga {saga_id}: {n} {event} by {actor} done, {have.get((saga_id, event, actor), 0)} "
        "in its history"
        for (saga_id, event, actor), n in sorted(wanted.items())
        if have.get((saga_id, event, actor), 0) < n
    ]


def saga_ids_in(lines: Iterable[str]) -> list[str]:
    """The saga ids the violation lines name, in order, each once."""
    import re

    found: dict[str, None] = {}
    for line in lines:
        for m in re.finditer(r"saga ([0-9a-f]{8}-[0-9a-f-]{27})", line):
            found.setdefault(m.group(1), None)
    return list(found)


def evidence(engine: Any, saga_ids: Iterable[str], limit: int = 10) -> dict[str, list[str]]:
    """Each saga as an incident review reads it: status, steps, then its history."""
    found: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for saga_id in list(saga_ids)[:limit]:
            saga = conn.execute(
                text(
                    "SELECT status, status_reason, version, business_key, next_wake_at "
                    "FROM saga.saga_instance WHERE saga_id = CAST(:s AS uuid)"
                ),
                {"s": saga_id},
            ).first()
            if saga is None:
                continue
            lines = [
                f"{saga.business_key} {saga.status} v{saga.version} "
                f"(reason: {saga.status_reason}; next_wake_at {saga.next_wake_at})"
            ]
            lines += [
                f"step {r.step}: {r.status} attempt {r.attempt}/{r.compensation_attempt} "
                f"gen {r.generation} command {r.command_id} compensation {r.compensation_id}"
                for r in conn.execute(
                    text(
                        "SELECT step, status, attempt, compensation_attempt, generation, "
                        "command_id, compensation_id FROM saga.saga_step "
                        "WHERE saga_id = CAST(:s AS uuid) ORDER BY position"
                    ),
                    {"s": saga_id},
                )
            ]
            lines += [
                f"{r.at:%H:%M:%S.%f} {r.event} {r.step or '-'} "
                f"{r.status_before}->{r.status_after} "
                f"{r.step_status_before or ''}->{r.step_status_after or ''} "
                f"[{r.actor}] {r.reason or ''}".rstrip()
                for r in conn.execute(
                    text(
                        "SELECT at, event, step, status_before, status_after, "
                        "step_status_before, step_status_after, actor, reason "
                        "FROM saga.saga_history WHERE saga_id = CAST(:s AS uuid) ORDER BY id"
                    ),
                    {"s": saga_id},
                )
            ]
            found[saga_id] = lines
    return found
