"""``Idempotency-Key`` of HTTP starts: one key, one saga, whatever the concurrency.

The key is claimed in the transaction that starts the saga, by an insert on its primary
key. A second transaction claiming the same key waits on the index until the first ends:
if the first committed, the claim inserts nothing and the caller rolls its start back and
answers from the stored row; if it rolled back, the claim succeeds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.persistence.tables import api_idempotency


@dataclass(frozen=True)
class StoredKey:
    """What a key was first used for."""

    request_hash: str
    saga_id: str


def request_hash(saga_type: str, business_key: str, payload: Mapping[str, Any]) -> str:
    """A stable digest of a start request, to tell a repeat from another request."""
    canonical = json.dumps([saga_type, business_key, payload], sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def find(conn: Connection, key: str) -> StoredKey | None:
    """The request and saga ``key`` was used for, or None."""
    row = conn.execute(
        select(api_idempotency.c.request_hash, api_idempotency.c.saga_id).where(
            api_idempotency.c.key == key
        )
    ).first()
    return None if row is None else StoredKey(row.request_hash, str(row.saga_id))


def claim(conn: Connection, key: str, digest: str, saga_id: str) -> bool:
    """Store ``key`` for this request and saga; False if another transaction stored it
    first (this one waited for it to commit). Run it in the transaction of the start."""
    inserted = conn.execute(
        pg_insert(api_idempotency)
        .values(key=key, request_hash=digest, saga_id=saga_id)
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(api_idempotency.c.key)
    ).first()
    return inserted is not None
