"""Flow control's release as a function whose plan needs no statistics.

The release counted a queue's commands in flight and picked its oldest waiting ones
through a join with ``saga_instance`` (only running or compensating sagas count). The
plan of that join depends on the planner's statistics, and a queue table's are wrong
by nature: analysed while the queue was quiet, they say "almost empty" when a burst
arrives, and the plan became a nested loop of sequential scans, a cost per release
that grew with the square of the backlog (measured: 33 ms per release, 4.6 sagas/s,
after a VACUUM ANALYZE of a quiet database; README, Performance).

Now each waiting or sent row carries ``paused`` (its saga is not running or
compensating: in review, or ended), written by the statement that writes the saga's
status, so the release reads ``saga_dispatch`` alone, through two partial indexes;
and it runs as ``saga.dispatch_release``, a function planned with sequential and
bitmap scans off, so those indexes are used whatever the statistics say. The
advisory locks are taken inside it, in queue order, before the query that counts:
a volatile function's every query takes a new snapshot, so the count sees the commit
of the release before (one round trip where there were two).

Upgrade with the orchestrators of the earlier release stopped: one of them that sends a
saga to review after this migration leaves that saga's rows unpaused (counted, and
free to go out) until the saga moves again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

RELEASE = """
CREATE OR REPLACE FUNCTION saga.dispatch_release(
    p_queues text[], p_limits jsonb, p_most bigint, p_now timestamptz)
RETURNS SETOF saga.outbox
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $release$
DECLARE
    q text;
BEGIN
    -- One release at a time per queue; in the order given (sorted by the caller), so
    -- two releases never wait for each other's locks in a cycle.
    FOREACH q IN ARRAY p_queues LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('saga_tasks.dispatch:' || q, 0));
    END LOOP;
    RETURN QUERY
    WITH lim AS (
        SELECT * FROM jsonb_to_recordset(p_limits)
            AS l(queue text, max_in_flight bigint, rate float8)),
    bucket AS (
        SELECT l.queue, CASE WHEN l.rate > 0 THEN least(greatest(l.rate, 1.0), coalesce(
                 b.tokens + greatest(extract(epoch FROM p_now - b.at), 0) * l.rate,
                 greatest(l.rate, 1.0))) END AS tokens
        FROM lim l LEFT JOIN saga.dispatch_rate b ON b.queue = l.queue),
    room AS (
        SELECT l.queue, greatest(least(
          CASE WHEN l.max_in_flight > 0 THEN l.max_in_flight - (
            SELECT count(*) FROM (
              SELECT FROM saga.saga_dispatch d
              WHERE d.queue = l.queue AND d.sent_at IS NOT NULL AND NOT d.paused
              LIMIT l.max_in_flight) o)
          ELSE p_most END,
          CASE WHEN bk.tokens IS NOT NULL THEN floor(bk.tokens)::bigint ELSE p_most END,
          p_most), 0) AS n
        FROM lim l JOIN bucket bk ON bk.queue = l.queue),
    picked AS (
        SELECT w.message_id, w.queue FROM room r CROSS JOIN LATERAL (
          SELECT d.message_id, d.queue FROM saga.saga_dispatch d
          WHERE d.queue = r.queue AND d.sent_at IS NULL AND d.withdrawn_at IS NULL
            AND NOT d.paused
          ORDER BY d.created_at LIMIT r.n
          FOR UPDATE SKIP LOCKED) w),
    sent AS (
        UPDATE saga.saga_dispatch d SET sent_at = p_now
        WHERE d.message_id = ANY(ARRAY(SELECT p.message_id FROM picked p))
        RETURNING d.*),
    spent AS (
        INSERT INTO saga.dispatch_rate (queue, tokens, at)
        SELECT bk.queue, bk.tokens - (SELECT count(*) FROM picked p WHERE p.queue = bk.queue),
               p_now
        FROM bucket bk WHERE bk.tokens IS NOT NULL
        ON CONFLICT (queue) DO UPDATE
          SET tokens = excluded.tokens, at = greatest(saga.dispatch_rate.at, excluded.at)
        RETURNING 1),
    moved AS (
        INSERT INTO saga.outbox (message_id, saga_id, task_name, queue, routing_key, headers, body)
        SELECT message_id, saga_id, task_name, queue, routing_key, headers, body FROM sent
        RETURNING *)
    SELECT * FROM moved;
END
$release$
"""


def upgrade() -> None:
    op.add_column(
        "saga_dispatch",
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema="saga",
    )
    op.execute(
        "UPDATE saga.saga_dispatch d SET paused = true FROM saga.saga_instance s "
        "WHERE s.saga_id = d.saga_id AND s.status NOT IN ('RUNNING', 'COMPENSATING')"
    )
    _indexes(" AND NOT paused")
    op.execute(RELEASE)


def downgrade() -> None:
    op.execute("DROP FUNCTION saga.dispatch_release(text[], jsonb, bigint, timestamptz)")
    _indexes("")
    op.drop_column("saga_dispatch", "paused", schema="saga")


def _indexes(and_not_paused: str) -> None:
    """The waiting and the sent rows' partial indexes, with ``and_not_paused`` or not."""
    for name in ("ix_dispatch_waiting", "ix_dispatch_sent"):
        op.drop_index(name, table_name="saga_dispatch", schema="saga")
    op.create_index(
        "ix_dispatch_waiting",
        "saga_dispatch",
        ["queue", "created_at"],
        schema="saga",
        postgresql_where=sa.text(f"sent_at IS NULL AND withdrawn_at IS NULL{and_not_paused}"),
    )
    op.create_index(
        "ix_dispatch_sent",
        "saga_dispatch",
        ["queue"],
        schema="saga",
        postgresql_where=sa.text(f"sent_at IS NOT NULL{and_not_paused}"),
    )
