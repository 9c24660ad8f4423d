"""Many rows in one bound parameter: a JSON array read by ``jsonb_to_recordset``.

The hot path writes a saga's state, its changed steps, its history lines and its
outbox rows in one statement (a round trip and a parse each, whatever the row
count). Rows travel as one JSON array per table; the SQL that reads them back is
built once per table from its SQLAlchemy declaration, so column names and types
cannot drift from the schema. The statement text is the same for one row or five
hundred, so PostgreSQL and SQLAlchemy see one statement, not one per row count.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql

DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(value: Any) -> str:
    """``value`` (rows, or a JSON document) as JSON; datetimes as ISO 8601 with offset."""
    return json.dumps(value, default=_default, separators=(",", ":"))


def qualified(table: Table) -> str:
    return f"{table.schema}.{table.name}" if table.schema else table.name


@cache
def column_list(table: Table, names: tuple[str, ...]) -> str:
    """``name type, ...`` for a recordset's column definition list."""
    return ", ".join(f"{n} {table.c[n].type.compile(dialect=DIALECT)}" for n in names)


def rows_from(table: Table, names: tuple[str, ...], param: str, alias: str = "r") -> str:
    """The rows of ``:param`` as relation ``alias(names..., ord)``, ``ord`` their position.

    ``WITH ORDINALITY`` makes the array order explicit rather than incidental, so an
    ``ORDER BY ord`` gives identity columns (history ids) the order of the list.
    """
    cols = ", ".join(names)
    return (
        f"ROWS FROM (jsonb_to_recordset(CAST(:{param} AS jsonb)) AS ({column_list(table, names)})) "
        f"WITH ORDINALITY AS {alias}({cols}, ord)"
    )


def insert_from(
    table: Table,
    names: tuple[str, ...],
    param: str,
    *,
    also_from: str | None = None,
    where: str | None = None,
) -> str:
    """``INSERT INTO table (names) SELECT names FROM <the rows of :param>``, in list order.

    ``also_from`` joins another relation: a CTE that returned no row makes the insert
    write nothing (a start that met an existing business key, a claim that conflicted);
    ``where`` guards the insert the same way with a condition.
    """
    cols = ", ".join(names)
    source = rows_from(table, names, param)
    if also_from:
        source += f" CROSS JOIN {also_from}"
    if where:
        source += f" WHERE {where}"
    picked = ", ".join(f"r.{n}" for n in names)
    # Identifiers come from the table's declaration; every value is bound.
    return f"INSERT INTO {qualified(table)} ({cols}) SELECT {picked} FROM {source} ORDER BY r.ord"  # noqa: S608
