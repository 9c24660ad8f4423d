"""The definition versions stored sagas use: which ones unfinished sagas still need, and
a saga's step rows laid out again for the version it moved to."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, func, select, text

from saga_tasks.core.states import SagaStatus
from saga_tasks.persistence.tables import saga_instance

UNFINISHED = (SagaStatus.RUNNING, SagaStatus.COMPENSATING, SagaStatus.MANUAL_REVIEW)
"""Sagas that still need their definition: a reply, a deadline or a person moves them."""


def unfinished_versions(conn: Connection) -> list[tuple[str, int, int]]:
    """(saga type, definition version, unfinished sagas) for every version in use: one
    GROUP BY over the unfinished sagas only (the status index), whatever the history."""
    stmt = (
        select(saga_instance.c.saga_type, saga_instance.c.definition_version, func.count())
        .where(saga_instance.c.status.in_([s.value for s in UNFINISHED]))
        .group_by(saga_instance.c.saga_type, saga_instance.c.definition_version)
        .order_by(saga_instance.c.saga_type, saga_instance.c.definition_version)
    )
    return [(row[0], int(row[1]), int(row[2])) for row in conn.execute(stmt)]


_LAY_OUT = text(
    """WITH dropped AS (
           DELETE FROM saga.saga_step
           WHERE saga_id = :saga_id AND NOT (step = ANY(CAST(:steps AS text[]))))
       UPDATE saga.saga_step AS st SET position = o.ord - 1
       FROM unnest(CAST(:steps AS text[])) WITH ORDINALITY AS o(step, ord)
       WHERE st.saga_id = :saga_id AND st.step = o.step AND st.position <> o.ord - 1"""
)


def lay_out_steps(conn: Connection, saga_id: str, steps: Sequence[str]) -> None:
    """Keep only ``steps`` of a saga that moved to another version, in that order (one
    statement, under the saga's row lock). The steps the version lacks were PENDING."""
    conn.execute(_LAY_OUT, {"saga_id": saga_id, "steps": list(steps)})
