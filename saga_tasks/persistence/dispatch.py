"""Commands waiting for capacity at their queue, in PostgreSQL rather than in RabbitMQ.

A decision's command to a queue with a flow limit is written to ``saga_dispatch``
instead of the outbox. ``release`` moves the oldest waiting commands of some queues to
the outbox, as many as each queue's room allows (its ``max_in_flight`` less the commands
in flight, and the tokens of its rate bucket), in the deciding transaction; the caller
publishes them after the commit like any outbox row. A command stays counted in flight
until its step answers, is sent again or given up, or its saga stops waiting on it
(the decision that does so deletes its row in the same statement as the rest); while
its saga is in review its row is ``paused``, neither counted nor sent.

One transaction at a time releases for a queue (an advisory lock taken, in queue
order, in a query of its own, so the release's snapshot sees the commit of the one
before): the limit holds whatever number of orchestrators and sweepers run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, text

from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.persistence import outbox, recordset
from saga_tasks.persistence.tables import saga_dispatch

COLUMNS = (
    "message_id",
    "saga_id",
    "step",
    "queue",
    "task_name",
    "routing_key",
    "headers",
    "body",
    "paused",
)
ACTIVE = "('RUNNING', 'COMPENSATING')"
MOST_PER_RELEASE = 500
"""Commands one release moves to the outbox at most, over all its queues."""


@dataclass(frozen=True)
class QueueLimit:
    """How much of a queue's work may be in the broker and on its workers at once."""

    max_in_flight: int = 0
    """Commands sent and not yet answered; 0: no limit."""
    rate_limit: float = 0.0
    """Commands sent per second (a token bucket holding one second's worth); 0: no limit."""

    @property
    def active(self) -> bool:
        return self.max_in_flight > 0 or self.rate_limit > 0


def rows(messages: Sequence[OutboundMessage], paused: Iterable[str] = ()) -> str:
    """``messages`` as the JSON parameter of ``insert_sql``; those of the ``paused``
    sagas (neither running nor compensating once the statement has written them) wait
    paused, like that saga's other rows."""
    stopped = set(paused)
    return recordset.encode(
        [
            {
                "message_id": m.message_id,
                "saga_id": m.saga_id,
                "step": m.headers[H_STEP],
                "queue": m.queue,
                "task_name": m.task_name,
                "routing_key": m.routing_key,
                "headers": m.headers,
                "body": m.body,
                "paused": m.saga_id in stopped,
            }
            for m in messages
        ]
    )


def pairs(found: Iterable[tuple[str, str]]) -> str:
    """(saga id, step) pairs as the parameter of ``free_sql``."""
    return recordset.encode([{"saga_id": s, "step": step} for s, step in found])


@cache
def insert_sql(
    param: str = "dispatch", also_from: str | None = None, where: str | None = None
) -> str:
    """SQL inserting the waiting commands of ``:param`` (see ``rows``)."""
    return recordset.insert_from(saga_dispatch, COLUMNS, param, also_from=also_from, where=where)


def free_sql(where: str = "true") -> tuple[str, str]:
    """Two statements' SQL (for CTEs) over the (saga, step) pairs of ``:freed`` (steps
    that answered, or whose saga ended) and ``:superseded`` (steps sent again): the
    first deletes the freed steps' sent rows (their room is free); the second marks
    both kinds' waiting rows withdrawn (never sent, no longer wanted). In the statement
    that inserts a step's next command, neither sees that new row."""
    # ``:freed_sagas`` (the pairs' sagas as an array) lets the index on (saga_id, step)
    # find the rows: the planner takes a recordset for a hundred rows, and would rather
    # read the whole table, dead rows and all, than probe the index that often.
    match = (
        "d.saga_id = ANY(CAST(:freed_sagas AS uuid[])) AND d.saga_id = f.saga_id "
        "AND d.step = f.step"
    )
    pairs_of = "jsonb_to_recordset(CAST(:{} AS jsonb)) AS f(saga_id uuid, step text)"
    delete = f"""DELETE FROM saga.saga_dispatch d USING {pairs_of.format("freed")}
        WHERE {match} AND d.sent_at IS NOT NULL AND {where}"""  # noqa: S608
    withdraw = f"""UPDATE saga.saga_dispatch d SET withdrawn_at = :now
        FROM (SELECT * FROM {pairs_of.format("freed")}
              UNION SELECT * FROM {pairs_of.format("superseded")}) f
        WHERE {match} AND d.sent_at IS NULL AND d.withdrawn_at IS NULL AND {where}"""  # noqa: S608
    return delete, withdraw


def pause_sql(where: str = "true") -> str:
    """SQL (for a CTE) marking the rows of the sagas in ``:sagas`` (see
    ``sagas.write_changes``) paused when a saga's new status is neither running nor
    compensating (in review, or ended), and not paused when it is: a paused row neither
    counts in flight nor goes out. Rows the same statement deletes or withdraws
    (``free_sql``) are left to it, as a statement writes a row once; a command held by
    the same statement, which this one cannot see, is written paused or not from its
    saga's new status (``params``)."""
    pairs_of = "jsonb_to_recordset(CAST(:{} AS jsonb)) AS f(saga_id uuid, step text)"
    return f"""UPDATE saga.saga_dispatch d SET paused = v.status NOT IN {ACTIVE}
        FROM jsonb_to_recordset(CAST(:sagas AS jsonb)) AS v(saga_id uuid, status text)
        WHERE d.saga_id = ANY(CAST(:saga_ids AS uuid[])) AND d.saga_id = v.saga_id
          AND d.withdrawn_at IS NULL AND d.paused <> (v.status NOT IN {ACTIVE})
          AND NOT EXISTS (SELECT FROM {pairs_of.format("freed")}
                          WHERE f.saga_id = d.saga_id AND f.step = d.step)
          AND NOT (d.sent_at IS NULL AND EXISTS (
                   SELECT FROM {pairs_of.format("superseded")}
                   WHERE f.saga_id = d.saga_id AND f.step = d.step))
          AND {where}"""  # noqa: S608


_RELEASE = text(
    "SELECT * FROM saga.dispatch_release("
    "CAST(:queues AS text[]), CAST(:limits AS jsonb), :most, CAST(:now AS timestamptz))"
)


def release(
    conn: Connection,
    limits: Mapping[str, QueueLimit],
    now: datetime,
    *,
    most: int = MOST_PER_RELEASE,
) -> list[OutboundMessage]:
    """Move the oldest waiting commands of ``limits``' queues to the outbox, as room
    allows (a queue whose limit is not active: all of them), for sagas that are running
    or compensating (one in review waits for its person); the messages to publish once
    ``conn``'s transaction commits. ``now`` (the app's clock) stamps their dispatch,
    from which their steps' deadlines run; a bucket's clock never moves back.

    The work is ``saga.dispatch_release`` (migration 0006): its plan reads this table
    alone through its partial indexes whatever the statistics say, as a queue table's
    are wrong by nature (quiet when analysed, a backlog when read)."""
    queues = sorted(limits)
    if not queues:
        return []
    param = recordset.encode(
        [
            {
                "queue": q,
                "max_in_flight": limits[q].max_in_flight,
                "rate": limits[q].rate_limit,
            }
            for q in queues
        ]
    )
    result = conn.execute(_RELEASE, {"queues": queues, "limits": param, "most": most, "now": now})
    return [outbox.to_message(row) for row in result]


def dispatch_times(
    conn: Connection, saga_ids: Sequence[str]
) -> dict[str, dict[str, datetime | None]]:
    """Saga -> step -> when its latest command left for the broker (None: it waits for
    capacity), for the steps whose commands are under flow control."""
    if not saga_ids:
        return {}
    found: dict[str, dict[str, datetime | None]] = {}
    for row in conn.execute(
        text(
            "SELECT DISTINCT ON (saga_id, step) saga_id, step, sent_at FROM saga.saga_dispatch "
            "WHERE saga_id = ANY(CAST(:ids AS uuid[])) AND withdrawn_at IS NULL "
            "ORDER BY saga_id, step, created_at DESC"
        ),
        {"ids": list(saga_ids)},
    ):
        found.setdefault(str(row.saga_id), {})[row.step] = row.sent_at
    return found


@dataclass(frozen=True)
class QueueFlow:
    """One queue's commands under flow control, as ``counts`` sees them."""

    waiting: int
    """Commands of running or compensating sagas waiting for capacity."""
    in_flight: int
    """Commands of running or compensating sagas sent and not yet answered."""
    oldest_wait_seconds: float
    """How long the oldest of the ``waiting`` has waited."""
    paused: int = 0
    """Commands, waiting or sent, of sagas that wait for a person (in review): neither
    waiting for capacity nor in flight until a person sends the saga on."""


def counts(conn: Connection) -> dict[str, QueueFlow]:
    """Waiting, in-flight and paused commands per queue (gauges, the dashboard,
    admission). A paused row counts as neither waiting nor in flight: a saga in review
    neither takes room nor asks for it, so it must not make admission control refuse
    starts while its participant is idle."""
    found: dict[str, QueueFlow] = {}
    for row in conn.execute(
        text(
            """SELECT d.queue,
                  count(*) FILTER (WHERE d.sent_at IS NULL AND NOT d.paused) AS waiting,
                  count(*) FILTER (WHERE d.sent_at IS NOT NULL AND NOT d.paused)
                      AS in_flight,
                  count(*) FILTER (WHERE d.paused) AS paused,
                  coalesce(extract(epoch FROM now() - min(d.created_at)
                      FILTER (WHERE d.sent_at IS NULL AND NOT d.paused)), 0) AS oldest
                FROM saga.saga_dispatch d
                WHERE d.withdrawn_at IS NULL
                GROUP BY d.queue"""
        )
    ):
        found[row.queue] = QueueFlow(
            int(row.waiting), int(row.in_flight), float(row.oldest), int(row.paused)
        )
    return found


def out(conn: Connection, found: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of the (saga id, step) pairs have a command sent and not yet answered."""
    if not found:
        return set()
    rows = conn.execute(
        text(
            "SELECT DISTINCT d.saga_id::text, d.step FROM saga.saga_dispatch d "
            "JOIN jsonb_to_recordset(CAST(:pairs AS jsonb)) AS f(saga_id uuid, step text) "
            "ON d.saga_id = f.saga_id AND d.step = f.step WHERE d.sent_at IS NOT NULL"
        ),
        {"pairs": pairs(found)},
    )
    return {(r[0], r[1]) for r in rows}


def take_place(
    conn: Connection,
    message: OutboundMessage,
    step: str,
    *,
    now: datetime,
) -> bool:
    """Record ``message``, published to its queue by hand (a replay) for ``step`` of a
    running or compensating saga, as sent at ``now``: it holds the step's place until the
    step answers, unless a copy of the step's sent before holds it already. A copy of
    the step's command still waiting for capacity is withdrawn: the replay is that
    command (the step awaits one at a time) and went out already; released as well, the
    step would hold two places. True when recorded."""
    recorded = conn.execute(
        text(
            """WITH withdrawn AS (
                   UPDATE saga.saga_dispatch SET withdrawn_at = :now
                   WHERE saga_id = CAST(:saga_id AS uuid) AND step = :step
                     AND sent_at IS NULL AND withdrawn_at IS NULL
                     AND message_id <> CAST(:message_id AS uuid))
               INSERT INTO saga.saga_dispatch (message_id, saga_id, step, queue, task_name,
                   routing_key, headers, body, sent_at)
               SELECT CAST(:message_id AS uuid), CAST(:saga_id AS uuid), :step, :queue,
                      :task_name, :routing_key, CAST(:headers AS jsonb), CAST(:body AS jsonb),
                      :now
               WHERE NOT EXISTS (
                   SELECT FROM saga.saga_dispatch d
                   WHERE d.saga_id = CAST(:saga_id AS uuid) AND d.step = :step
                     AND d.sent_at IS NOT NULL)
               ON CONFLICT (message_id) DO UPDATE
                   SET sent_at = excluded.sent_at, withdrawn_at = NULL, paused = false
               RETURNING 1"""
        ),
        {
            "message_id": message.message_id,
            "saga_id": message.saga_id,
            "step": step,
            "queue": message.queue,
            "task_name": message.task_name,
            "routing_key": message.routing_key,
            "headers": recordset.encode(message.headers),
            "body": recordset.encode(message.body),
            "now": now,
        },
    ).first()
    return recorded is not None


def waiting_queues(conn: Connection) -> list[str]:
    """Queues with commands waiting for capacity."""
    return [
        row[0]
        for row in conn.execute(
            text(
                "SELECT DISTINCT queue FROM saga.saga_dispatch "
                "WHERE sent_at IS NULL AND withdrawn_at IS NULL"
            )
        )
    ]


def params(
    held: Sequence[OutboundMessage],
    freed: Iterable[tuple[str, str]],
    superseded: Iterable[tuple[str, str]],
    paused: Iterable[str] = (),
) -> dict[str, Any]:
    """The parameters of a statement that holds commands and frees their steps' rows;
    ``paused``: the sagas it leaves neither running nor compensating (a decision can
    hold a command and leave its saga in review: a fence for a step done by hand)."""
    freed, superseded = list(freed), list(superseded)
    return {
        "dispatch": rows(held, paused),
        "freed": pairs(freed),
        "superseded": pairs(superseded),
        "freed_sagas": sorted({s for s, _ in freed} | {s for s, _ in superseded}),
    }
