"""The schema, declared once in SQLAlchemy Core; migrations create exactly this.

The orchestrator's tables live in the ``saga`` schema. Each participant owns a
schema of its own holding its command ledger and outbox next to its business
tables, as it would in a database of its own.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

SAGA_SCHEMA = "saga"
ORCHESTRATOR = "orchestrator"
"""Consumer name of the orchestrator in the inbox."""

metadata = MetaData()

saga_instance = Table(
    "saga_instance",
    metadata,
    Column("saga_id", UUID(as_uuid=False), primary_key=True),
    Column("saga_type", Text, nullable=False),
    Column("definition_version", Integer, nullable=False),
    Column("business_key", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("status_reason", Text),
    Column("version", BigInteger, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("payload_hash", Text, nullable=False),
    Column("correlation_id", Text, nullable=False),
    Column("traceparent", Text),
    Column("deadline", DateTime(timezone=True)),
    Column("next_wake_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("id_key", Text),
    UniqueConstraint("saga_type", "business_key", name="uq_saga_type_business_key"),
    Index(
        "ix_saga_next_wake_active",
        "next_wake_at",
        postgresql_where=text("status IN ('RUNNING', 'COMPENSATING')"),
    ),
    Index("ix_saga_status_updated", "status", "updated_at"),
    Index("ix_saga_created", "created_at"),
    Index("ix_saga_status_created", "status", "created_at"),
    Index("ix_saga_business_key", "business_key"),
    Index(
        "ix_saga_finished",
        "finished_at",
        postgresql_where=text("status IN ('COMPLETED', 'COMPENSATED', 'FAILED')"),
    ),
    schema=SAGA_SCHEMA,
)

saga_step = Table(
    "saga_step",
    metadata,
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("step", Text, nullable=False),
    Column("position", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("compensation_attempt", Integer, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("command_id", UUID(as_uuid=False)),
    Column("compensation_id", UUID(as_uuid=False)),
    Column("requested_at", DateTime(timezone=True)),
    Column("deadline", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("result", JSONB(none_as_null=True)),
    Column("last_error", Text),
    Column("given_up", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("saga_id", "step", name="pk_saga_step"),
    schema=SAGA_SCHEMA,
)

saga_history = Table(
    "saga_history",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("event", Text, nullable=False),
    Column("step", Text),
    Column("status_before", Text),
    Column("status_after", Text),
    Column("step_status_before", Text),
    Column("step_status_after", Text),
    Column("message_id", Text),
    Column("causation_id", Text),
    Column("actor", Text, nullable=False),
    Column("reason", Text),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Index("ix_history_saga", "saga_id", "id"),
    schema=SAGA_SCHEMA,
)


saga_note_tally = Table(
    "saga_note_tally",
    metadata,
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("event", Text, nullable=False),
    Column("noted", BigInteger, nullable=False),
    Column("dropped", BigInteger, nullable=False, server_default=text("0")),
    Column("last_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("saga_id", "event", name="pk_saga_note_tally"),
    schema=SAGA_SCHEMA,
)
"""How many notes that change nothing (``sagas.NOTES``) each saga was given of each kind
(``noted``), and how many of the oldest were dropped from its history (``dropped``): a
saga keeps the newest ``sagas.NOTES_KEPT`` of each kind, as anyone who can publish a
message naming it can cause one."""


def outbox_table(schema: str, meta: MetaData = metadata) -> Table:
    """An outbox: messages a committed transaction owes the broker."""
    return Table(
        "outbox",
        meta,
        Column("message_id", UUID(as_uuid=False), primary_key=True),
        Column("saga_id", UUID(as_uuid=False)),
        Column("task_name", Text, nullable=False),
        Column("queue", Text, nullable=False),
        Column("routing_key", Text),
        Column("headers", JSONB, nullable=False),
        Column("body", JSONB, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("published_at", DateTime(timezone=True)),
        Column("publish_attempts", Integer, nullable=False, server_default=text("0")),
        Column("recovered", Boolean, nullable=False, server_default=text("false")),
        Index(
            f"ix_{schema}_outbox_unpublished",
            "created_at",
            postgresql_where=text("published_at IS NULL"),
        ),
        schema=schema,
    )


def ledger_table(schema: str, meta: MetaData = metadata) -> Table:
    """A participant's command ledger: one row per command id, holding the reply it gave.

    ``kind`` is ``command``, ``compensation`` or ``tombstone``: a tombstone is the row a
    compensation leaves for a forward command that never ran, so that the command,
    should it arrive later, conflicts on the key and is refused.
    """
    return Table(
        "command_ledger",
        meta,
        Column("command_id", UUID(as_uuid=False), primary_key=True),
        Column("saga_id", UUID(as_uuid=False), nullable=False),
        Column("step", Text, nullable=False),
        Column("kind", Text, nullable=False),
        Column("task_name", Text, nullable=False),
        Column("outcome", Text, nullable=False),
        Column("reply_message_id", UUID(as_uuid=False)),
        Column("reply", JSONB(none_as_null=True)),
        Column("compensates", UUID(as_uuid=False)),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        schema=schema,
    )


saga_outbox = outbox_table(SAGA_SCHEMA)
Index("ix_saga_outbox_saga", saga_outbox.c.saga_id)  # the purge finds a saga's rows

inbox = Table(
    "inbox",
    metadata,
    Column("consumer", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("saga_id", UUID(as_uuid=False)),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("consumer", "message_id", name="pk_inbox"),
    Index("ix_inbox_saga", "saga_id"),
    schema=SAGA_SCHEMA,
)

invalid_message = Table(
    "invalid_message",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("consumer", Text, nullable=False),
    Column("queue", Text),
    Column("routing_key", Text),
    Column("task_name", Text),
    Column("message_id", Text),
    Column("saga_id", Text),
    Column("reason", Text, nullable=False),
    Column("headers", JSONB, nullable=False),
    Column("body_sha256", Text),
    Column("body_size", Integer),
    Index("ix_invalid_received", "received_at"),
    schema=SAGA_SCHEMA,
)


held_message = Table(
    "held_message",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("holding", Text, nullable=False),
    Column("delivery_key", Text, nullable=False),
    Column("message_id", Text),
    Column("saga_id", UUID(as_uuid=False)),
    Column("step", Text),
    Column("kind", Text),
    Column("task_name", Text),
    Column("original_queue", Text),
    Column("original_routing_key", Text),
    Column("original_exchange", Text),
    Column("reason", Text, nullable=False),
    Column("death_count", Integer, nullable=False, server_default=text("0")),
    Column("first_death_at", DateTime(timezone=True)),
    Column("last_death_at", DateTime(timezone=True)),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("content_type", Text),
    Column("content_encoding", Text),
    Column("headers", JSONB, nullable=False),
    Column("body", Text),
    Column("body_base64", Boolean, nullable=False, server_default=text("false")),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("resolved_at", DateTime(timezone=True)),
    Column("resolved_by", Text),
    Column("resolution", Text),
    Column("published_by", Text),
    Column("attested", Boolean, nullable=False, server_default=text("true")),
    Column("acked", Boolean, nullable=False, server_default=text("true")),
    Index("ix_held_saga", "saga_id"),
    Index("ix_held_unacked", "holding", "delivery_key", postgresql_where=text("NOT acked")),
    Index("ix_held_pending", "holding", "received_at", postgresql_where=text("status = 'pending'")),
    schema=SAGA_SCHEMA,
)
"""Messages taken off the dead-letter and parking-lot queues, kept for operators.

``holding`` is ``dead_letter`` or ``parking``. A row is one delivery: two publishes are
two rows, even alike in every byte. ``delivery_key`` digests what RabbitMQ keeps when it
delivers a message again (every property and header but ``x-delivery-count``, the
body), and ``acked`` says the broker processed the row's ack: a message delivered again
after a crash claims the unacked row of the same key instead of being stored twice.
``published_by`` is the broker user that published it (its AMQP ``user_id``, which the
broker checked), ``attested`` false when that user may not speak for its step: such a
message moved no saga, and its reason is the publisher's claim.
The body is kept as the broker delivered it, for replay; it never goes to logs.
"""


def redelivery_table(schema: str, meta: MetaData = metadata) -> Table:
    """Redeliveries per message: a message that keeps killing its worker is dead-lettered
    after a bounded number of them. Only redelivered messages are counted, so the hot
    path (first deliveries) writes nothing here. The orchestrator's is in the saga schema;
    each participant counts its own in its schema (its database)."""
    return Table(
        "redelivery",
        meta,
        Column("consumer", Text, nullable=False),
        Column("message_id", Text, nullable=False),
        Column("count", Integer, nullable=False),
        Column("first_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("last_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint(
            "consumer",
            "message_id",
            name="pk_redelivery" if schema == SAGA_SCHEMA else f"pk_{schema}_redelivery",
        ),
        schema=schema,
    )


redelivery = redelivery_table(SAGA_SCHEMA)

alert_sent = Table(
    "alert_sent",
    metadata,
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("condition", Text, nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("saga_id", "condition", name="pk_alert_sent"),
    schema=SAGA_SCHEMA,
)
"""One row per saga and alert condition: an alert is sent once, whatever scans overlap."""

api_idempotency = Table(
    "api_idempotency",
    metadata,
    Column("key", Text, primary_key=True),
    Column("request_hash", Text, nullable=False),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    schema=SAGA_SCHEMA,
)
"""``Idempotency-Key`` of HTTP starts: a repeat gets the first answer; a different body, 409."""

status_sample = Table(
    "status_sample",
    metadata,
    Column("at", DateTime(timezone=True), nullable=False),
    Column("saga_type", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("count", BigInteger, nullable=False),
    PrimaryKeyConstraint("at", "saga_type", "status", name="pk_status_sample"),
    schema=SAGA_SCHEMA,
)
"""How many sagas were in each status, every ``SAGA_SAMPLE_INTERVAL`` seconds: the
dashboard's counts over time, read without touching the saga table."""

saga_dispatch = Table(
    "saga_dispatch",
    metadata,
    Column("message_id", UUID(as_uuid=False), primary_key=True),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("step", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("task_name", Text, nullable=False),
    Column("routing_key", Text),
    Column("headers", JSONB, nullable=False),
    Column("body", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("sent_at", DateTime(timezone=True)),
    Column("withdrawn_at", DateTime(timezone=True)),
    Column("paused", Boolean, nullable=False, server_default=false()),
    Index(
        "ix_dispatch_waiting",
        "queue",
        "created_at",
        postgresql_where=text("sent_at IS NULL AND withdrawn_at IS NULL AND NOT paused"),
    ),
    Index("ix_dispatch_sent", "queue", postgresql_where=text("sent_at IS NOT NULL AND NOT paused")),
    Index("ix_dispatch_saga", "saga_id", "step"),
    schema=SAGA_SCHEMA,
)
"""Commands to a queue with a flow limit, from the decision that sent them until their
step answers. ``sent_at`` NULL: waiting for capacity (the message is here, not in the
outbox); set: moved to the outbox and counted in flight. ``withdrawn_at``: never sent,
and no longer wanted (its step answered, or its saga ended, first); kept as the record of
a command the saga decided on that never reached the broker. ``paused``: its saga is
neither running nor compensating (in review): the row neither counts nor goes out."""

dispatch_rate = Table(
    "dispatch_rate",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    schema=SAGA_SCHEMA,
)
"""The token bucket of each queue with a rate limit."""

schedule_run = Table(
    "schedule_run",
    metadata,
    Column("schedule", Text, nullable=False),
    Column("tick", DateTime(timezone=True), nullable=False),
    Column("saga_type", Text, nullable=False),
    Column("business_key", Text, nullable=False),
    Column("saga_id", UUID(as_uuid=False)),
    Column("started_at", DateTime(timezone=True)),
    Column("fired_at", DateTime(timezone=True), nullable=False),
    Column("firings", Integer, nullable=False, server_default=text("1")),
    Column("missed_before", Integer, nullable=False, server_default=text("0")),
    Column("error", Text),
    PrimaryKeyConstraint("schedule", "tick", name="pk_schedule_run"),
    Index("ix_schedule_run_error", "schedule", "tick", postgresql_where=text("error IS NOT NULL")),
    schema=SAGA_SCHEMA,
)
"""One row per tick of a schedule that a firing reached: the saga it started (written in
the start's own transaction) or why it started none (``error``: late, the payload function
raised, the payload was refused, admission control). ``firings`` > 1: the tick was fired
again (a takeover, a redelivery) and started nothing more; ``missed_before``: ticks before
this one that no firing started (beat away, or too late)."""

bulk_run = Table(
    "bulk_run",
    metadata,
    Column("incident", Text, primary_key=True),
    Column("verb", Text, nullable=False),
    Column("selection", JSONB, nullable=False),
    Column("options", JSONB, nullable=False),
    Column("actor", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    schema=SAGA_SCHEMA,
)
"""One row per incident acted on in bulk: the verb, the filter that chose its sagas and
who ran it. Running the same incident again continues it; another verb or filter under
its name is refused."""

bulk_item = Table(
    "bulk_item",
    metadata,
    Column("incident", Text, nullable=False),
    Column("saga_id", UUID(as_uuid=False), nullable=False),
    Column("outcome", Text, nullable=False),
    Column("detail", Text),
    Column("at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("incident", "saga_id", name="pk_bulk_item"),
    Index("ix_bulk_item_saga", "saga_id"),
    schema=SAGA_SCHEMA,
)
"""Each saga a bulk run reached: ``accepted`` (written in the transaction of the action
itself, so a run killed at any instant never acts twice on a saga) or ``refused`` with
the decider's reason."""

purged_saga = Table(
    "purged_saga",
    metadata,
    Column("saga_id", UUID(as_uuid=False), primary_key=True),
    Column("saga_type", Text, nullable=False),
    Column("business_key", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("purged_at", DateTime(timezone=True), nullable=False),
    Index("ix_purged_saga_purged", "purged_at"),
    schema=SAGA_SCHEMA,
)
"""What is left of a saga purged after its retention: enough to answer "purged" (how it
ended, when) for an id that existed, rather than "no such saga"."""
