"""Flow control's release reads an index, not a table, whatever the statistics say.

A queue table's statistics are wrong by nature: analysed while the queue was quiet,
they say "almost empty" when a burst arrives. The release's old plan then joined
``saga_dispatch`` and ``saga_instance`` by sequential scans, a cost per release that
grew with the square of the backlog (4.6 sagas/s in the benchmark after a VACUUM
ANALYZE of a quiet database, against 23.4 with this plan). The test counts what the
release reads, in the transaction's own table statistics."""

from __future__ import annotations

import dataclasses

from sqlalchemy import text

from saga_tasks.persistence import dispatch
from tests.helpers import ORDER, build_order_app, drain

ORDERS = "orders.commands"


def reads(conn):
    """Scans and rows fetched by index, per table, so far in this session: the counts
    not yet sent to the statistics collector, which a transaction never sends."""
    found = {
        r.relname: (r.seq_scan, r.idx_tup_fetch)
        for r in conn.execute(
            text(
                "SELECT relname, seq_scan, idx_tup_fetch FROM pg_stat_xact_user_tables "
                "WHERE schemaname = 'saga' AND relname IN ('saga_dispatch', 'saga_instance')"
            )
        )
    }
    return {t: found.get(t, (0, 0)) for t in ("saga_dispatch", "saga_instance")}


def test_a_release_over_a_backlog_reads_no_table_whole_after_a_quiet_analyze(settings, clock):
    app = build_order_app(dataclasses.replace(settings, max_in_flight="orders=2"), clock=clock)
    try:
        app.start_saga("order", "quiet", ORDER)
        with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE saga.saga_dispatch, saga.saga_instance"))
        for i in range(150):  # a burst: two sent, the rest waiting
            app.start_saga("order", f"burst-{i}", ORDER)
        assert len(drain(settings.broker_url, ORDERS)) == 2
        with app.engine.begin() as conn:
            before = reads(conn)
            limits = {ORDERS: dispatch.QueueLimit(max_in_flight=5)}
            released = dispatch.release(conn, limits, clock.now())
            after = reads(conn)
        read = {t: tuple(a - b for a, b in zip(after[t], before[t], strict=True)) for t in after}
        assert len(released) == 3, "room for three more (five, less the two out)"
        assert read["saga_dispatch"][0] == 0, read
        assert read["saga_instance"][0] == 0, read
        fetched = sum(f for _, f in read.values())
        assert fetched <= 20, f"{fetched} rows fetched to count 2 and pick 3: {read}"
    finally:
        app.close()
