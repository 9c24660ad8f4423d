"""A participant's command ledger: claims by command id, stored replies, tombstones.

The primary key on ``command_id`` is the idempotency: a claim that inserts nothing
means the command was seen before (or its compensation left a tombstone), and a
concurrent claim of the same id waits on the key until the first transaction ends.
Statements are built once per participant (its schema) and reused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, Table, TextClause, text

from saga_tasks.core.messages import OutboundMessage
from saga_tasks.persistence import outbox, recordset
from saga_tasks.persistence.prepared import Prepared

TOMBSTONE = "tombstone"
"""``kind`` of the row a compensation leaves for a forward command that never ran."""


@dataclass(frozen=True)
class Claim:
    """One ledger row as a command claims it."""

    command_id: str
    saga_id: str
    step: str
    kind: str
    task_name: str
    compensates: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "saga_id": self.saga_id,
            "step": self.step,
            "kind": self.kind,
            "task_name": self.task_name,
            "compensates": self.compensates,
        }


_CLAIM_COLUMNS = ("command_id", "saga_id", "step", "kind", "task_name", "compensates")


@dataclass(frozen=True)
class _Statements:
    claim: Prepared
    claim_with_reply: Prepared
    stored: TextClause
    record_reply: Prepared
    tombstone: TextClause
    outcome: TextClause


_CLAIM_TYPES = dict.fromkeys(("step", "kind", "task_name"), "text") | {
    "command_id": "uuid",
    "saga_id": "uuid",
    "compensates": "uuid",
}
_REPLY_TYPES = {"outcome": "text", "reply": "jsonb", "reply_message_id": "uuid"}


@cache
def _statements(ledger: Table, outbox_table: Table) -> _Statements:
    name = recordset.qualified(ledger)
    key = (ledger.schema or "public").replace(".", "_")
    cols = ", ".join(_CLAIM_COLUMNS)
    values = ", ".join(f":{c}" for c in _CLAIM_COLUMNS)
    reply_cols = f"{cols}, outcome, reply, reply_message_id"
    reply_values = f"{values}, :outcome, CAST(:reply AS jsonb), :reply_message_id"
    replied = outbox.insert_sql(outbox_table, "outbox", also_from="claimed")
    sent = outbox.insert_sql(outbox_table, "outbox")
    # Identifiers come from the participant's table declarations; values are bound.
    return _Statements(
        claim=Prepared(
            f"saga_ledger_claim_{key}",
            f"INSERT INTO {name} ({cols}, outcome) VALUES ({values}, 'pending') "  # noqa: S608
            "ON CONFLICT (command_id) DO NOTHING RETURNING command_id",
            _CLAIM_TYPES,
        ),
        claim_with_reply=Prepared(
            f"saga_ledger_refuse_{key}",
            f"""WITH claimed AS (
                  INSERT INTO {name} ({reply_cols}) VALUES ({reply_values})
                  ON CONFLICT (command_id) DO NOTHING RETURNING 1 AS one),
                replied AS ({replied} RETURNING 1)
                SELECT count(*) FROM claimed""",  # noqa: S608
            _CLAIM_TYPES | _REPLY_TYPES | {"outbox": "jsonb"},
        ),
        stored=text(
            f"SELECT kind, reply, reply_message_id FROM {name} "  # noqa: S608
            "WHERE command_id = :command_id"
        ),
        record_reply=Prepared(
            f"saga_ledger_reply_{key}",
            f"""WITH sent AS ({sent} RETURNING 1)
                UPDATE {name} SET outcome = :outcome, reply = CAST(:reply AS jsonb),
                       reply_message_id = :reply_message_id
                WHERE command_id = :command_id""",  # noqa: S608
            _REPLY_TYPES | {"command_id": "uuid", "outbox": "jsonb"},
        ),
        tombstone=text(
            f"INSERT INTO {name} ({reply_cols}, created_at) "  # noqa: S608
            f"VALUES ({reply_values}, :created_at) "
            "ON CONFLICT (command_id) DO NOTHING RETURNING command_id"
        ),
        outcome=text(
            f"SELECT outcome FROM {name} WHERE command_id = :command_id"  # noqa: S608
        ),
    )


class Ledger:
    """The SQL of one participant's ledger and outbox."""

    def __init__(self, ledger: Table, outbox_table: Table) -> None:
        self._sql = _statements(ledger, outbox_table)

    def claim(self, conn: Connection, claim: Claim) -> bool:
        """Claim the command id (outcome pending); False if the ledger has it already."""
        return self._sql.claim.execute(conn, claim.params()).first() is not None

    def stored(self, conn: Connection, command_id: str) -> Row[Any]:
        """``(kind, reply, reply_message_id)`` of a claimed command id."""
        return conn.execute(self._sql.stored, {"command_id": command_id}).one()

    def record_reply(
        self,
        conn: Connection,
        command_id: str,
        *,
        outcome: str,
        reply: Mapping[str, Any],
        message: OutboundMessage,
    ) -> None:
        """Store the reply of a claimed command and put it in the outbox: one statement."""
        self._sql.record_reply.execute(
            conn,
            {
                "command_id": command_id,
                "outcome": outcome,
                "reply": recordset.encode(reply),
                "reply_message_id": message.message_id,
                "outbox": outbox.rows([message]),
            },
        )

    def claim_with_reply(
        self,
        conn: Connection,
        claim: Claim,
        *,
        outcome: str,
        reply: Mapping[str, Any],
        message: OutboundMessage,
    ) -> bool:
        """Claim, store the reply and queue it, in one statement; False (nothing written)
        if the ledger has the command id already."""
        params = {
            **claim.params(),
            "outcome": outcome,
            "reply": recordset.encode(reply),
            "reply_message_id": message.message_id,
            "outbox": outbox.rows([message]),
        }
        return bool(self._sql.claim_with_reply.execute(conn, params).scalar_one())

    def place_tombstone(
        self,
        conn: Connection,
        claim: Claim,
        *,
        reply: Mapping[str, Any],
        reply_message_id: str,
        outcome: str,
        now: datetime,
    ) -> bool:
        """Claim a forward command's id for its compensation; False if it was claimed."""
        params = {
            **claim.params(),
            "outcome": outcome,
            "reply": recordset.encode(reply),
            "reply_message_id": reply_message_id,
            "created_at": now,
        }
        return conn.execute(self._sql.tombstone, params).first() is not None

    def outcome(self, conn: Connection, command_id: str) -> str:
        return str(conn.execute(self._sql.outcome, {"command_id": command_id}).scalar_one())
