"""Hot statements prepared once per connection, so PostgreSQL parses and plans them once.

psycopg2 sends every statement as text, which PostgreSQL parses and plans anew each
time; for the few statements every message runs (claim and lock, write a decision,
start a saga, a participant's claim and reply) that is a measured share of the
server's work (README, Performance). ``Prepared`` issues ``PREPARE`` the first
time a pooled connection runs the statement and ``EXECUTE`` after that; the names
prepared live in the connection's ``info``, which SQLAlchemy clears when it replaces
the connection. A prepared statement outlives a rolled-back transaction. It is
prepared again after ``REPLAN_FIRST`` seconds, then at doubling intervals, so its plan
follows the tables as they grow.

Behind a PgBouncer in transaction pooling mode a session's prepared statements are
not there on the next transaction: set ``SAGA_DB_PREPARE=0`` and the same SQL runs
as plain text. A statement that went missing anyway (``DISCARD ALL``) fails its
transaction as a ``ConcurrencyConflict``, which retries the message; the retry
prepares it again.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Column, Connection, CursorResult, TextClause, exc, text

from saga_tasks.errors import ConcurrencyConflict
from saga_tasks.persistence.readsql import PARAM

log = logging.getLogger("saga_tasks.persistence")

_LITERAL = re.compile(r"'[^']*'")
_INFO_KEY = "saga_tasks.prepared"
_NO_SUCH_STATEMENT = "26000"  # invalid_sql_statement_name

REPLAN_FIRST = 5.0
REPLAN_MOST = 300.0
"""Seconds after which a statement is prepared again, doubling from the first to the
most. PostgreSQL keeps a prepared statement's generic plan, made from the tables' sizes
when it was made, until something invalidates it (an ANALYZE, which a server without
autovacuum never runs): a plan made while a table was small reads it whole once it is
large, or bloated. Tables change most, relative to their size, when they are young."""

PREPARE_KEY = "saga_tasks.prepare"
"""In a pooled connection's ``info``: False runs the same SQL as plain text (behind
PgBouncer in transaction mode). The engine sets it on each new connection
(``db.get_engine(..., prepare=)``), so the hot path reads a dict it already has."""


class Prepared:
    """One statement with ``:name`` parameters, each of a declared PostgreSQL type."""

    def __init__(
        self,
        name: str,
        sql: str,
        types: Mapping[str, str],
        columns: Sequence[Column[Any]] = (),
    ) -> None:
        order: list[str] = []
        for found in PARAM.findall(sql):
            if found not in order:
                order.append(found)
        if "%" in sql:
            raise ValueError(f"{name}: '%' would be read as a driver placeholder")
        if any(":" in literal for literal in _LITERAL.findall(sql)):
            raise ValueError(f"{name}: a ':' inside a string literal would read as a parameter")
        if set(order) != set(types):
            raise ValueError(f"{name}: parameters {sorted(order)} but types for {sorted(types)}")
        self.name = name
        numbered = PARAM.sub(lambda m: f"${order.index(m.group(1)) + 1}", sql)
        declared = ", ".join(types[p] for p in order)
        self._prepare = f"PREPARE {name} ({declared}) AS {numbered}"
        execute = f"EXECUTE {name}(" + ", ".join(f"CAST(:{p} AS {types[p]})" for p in order) + ")"
        self._execute: TextClause | Any = text(execute)
        self._plain: TextClause | Any = text(sql)
        if columns:
            self._execute = self._execute.columns(*columns)
            self._plain = self._plain.columns(*columns)

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> CursorResult[Any]:
        info = conn.connection.info
        if not info.get(PREPARE_KEY, True):
            return conn.execute(self._plain, params)
        names: dict[str, tuple[float, float]] = info.setdefault(_INFO_KEY, {})
        now = time.monotonic()
        due = names.get(self.name)
        try:
            if due is None or now >= due[0]:
                if due is not None:
                    # A session that lost it (see below) fails here, not at EXECUTE.
                    conn.exec_driver_sql(f"DEALLOCATE {self.name}")
                conn.exec_driver_sql(self._prepare)  # no parameters: sent as it is
                interval = REPLAN_FIRST if due is None else min(due[1] * 2, REPLAN_MOST)
                names[self.name] = (now + interval, interval)
            return conn.execute(self._execute, params)
        except exc.DBAPIError as error:
            if getattr(error.orig, "pgcode", None) != _NO_SUCH_STATEMENT:
                raise
            # The session lost what it prepared (DISCARD ALL, DEALLOCATE, or a pooler
            # that hands out another server connection). Forget it here, so the retry
            # this error causes prepares again; the transaction is lost either way.
            info.pop(_INFO_KEY, None)
            log.warning(
                "prepared statement %s missing on its connection; behind a pooler in "
                "transaction mode set SAGA_DB_PREPARE=0",
                self.name,
            )
            raise ConcurrencyConflict(f"prepared statement {self.name} was gone") from error
