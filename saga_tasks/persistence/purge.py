"""Purging finished sagas after their retention, in bounded batches, and the tombstones
that answer "purged" for their ids.

A batch is one statement: the oldest finished sagas due (by the partial index on
``finished_at``), locked with ``SKIP LOCKED`` so a decision or an operator on one of
them is neither waited for nor overtaken, each leaving a ``purged_saga`` row, and every
row naming them deleted from the saga tables. A saga still owing the broker a message
(an unpublished outbox row) or holding a message a person has not settled (a pending held
message) is passed over until it owes nothing: purging it would lose that message or
strand that person. Sagas active or in review are never chosen.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

FINISHED = ("COMPLETED", "COMPENSATED", "FAILED")
_DUE = """
    FROM saga.saga_instance s
    WHERE s.status IN ('COMPLETED', 'COMPENSATED', 'FAILED')
      AND s.finished_at < :before
      AND (CAST(:saga_type AS text) IS NULL OR s.saga_type = :saga_type)
      AND NOT EXISTS (SELECT 1 FROM saga.outbox o
                      WHERE o.saga_id = s.saga_id AND o.published_at IS NULL)
      AND NOT EXISTS (SELECT 1 FROM saga.held_message h
                      WHERE h.saga_id = s.saga_id AND h.status = 'pending')
      AND NOT EXISTS (SELECT 1 FROM saga.saga_step t
                      WHERE t.saga_id = s.saga_id
                        AND (t.status IN ('REQUESTED', 'COMPENSATING')
                             OR t.last_error = 'fencing'
                             OR (t.status = 'TIMED_OUT' AND t.given_up
                                 AND coalesce(t.last_error, '')
                                     NOT IN ('late_success', 'late_failure'))))"""

_PURGE = text(
    f"""WITH chosen AS (
        SELECT s.saga_id, s.saga_type, s.business_key, s.status, s.finished_at {_DUE}
        ORDER BY s.finished_at
        LIMIT :limit
        FOR UPDATE OF s SKIP LOCKED),
    tomb AS (
        INSERT INTO saga.purged_saga (saga_id, saga_type, business_key, status, finished_at,
                                      purged_at)
        SELECT saga_id, saga_type, business_key, status, finished_at, :now FROM chosen
        ON CONFLICT (saga_id) DO NOTHING),
    steps AS (DELETE FROM saga.saga_step t USING chosen c WHERE t.saga_id = c.saga_id),
    history AS (DELETE FROM saga.saga_history t USING chosen c WHERE t.saga_id = c.saga_id),
    tally AS (DELETE FROM saga.saga_note_tally t USING chosen c WHERE t.saga_id = c.saga_id),
    sent AS (DELETE FROM saga.outbox t USING chosen c WHERE t.saga_id = c.saga_id),
    seen AS (DELETE FROM saga.inbox t USING chosen c WHERE t.saga_id = c.saga_id),
    held AS (DELETE FROM saga.held_message t USING chosen c WHERE t.saga_id = c.saga_id),
    alerts AS (DELETE FROM saga.alert_sent t USING chosen c WHERE t.saga_id = c.saga_id),
    waits AS (DELETE FROM saga.saga_dispatch t USING chosen c WHERE t.saga_id = c.saga_id),
    bulk AS (DELETE FROM saga.bulk_item t USING chosen c WHERE t.saga_id = c.saga_id),
    gone AS (DELETE FROM saga.saga_instance t USING chosen c WHERE t.saga_id = c.saga_id
             RETURNING 1)
    SELECT count(*) FROM gone"""  # noqa: S608 - one constant string; values are bound
)

_DUE_NOW = text(f"SELECT count(*), min(s.finished_at) {_DUE}")


def purge_batch(
    conn: Connection, *, before: datetime, now: datetime, limit: int, saga_type: str | None = None
) -> int:
    """Purge up to ``limit`` sagas finished before ``before`` (of ``saga_type``, if
    given), oldest first, in the caller's transaction; how many were purged."""
    params = {"before": before, "now": now, "limit": limit, "saga_type": saga_type}
    return int(conn.execute(_PURGE, params).scalar_one())


def due(
    conn: Connection, *, before: datetime, saga_type: str | None = None
) -> tuple[int, datetime | None]:
    """How many sagas a purge with these bounds would take now, and when the oldest of
    them finished (a dry run)."""
    count, oldest = conn.execute(_DUE_NOW, {"before": before, "saga_type": saga_type}).one()
    return int(count), oldest
