"""The whole RabbitMQ topology as declared values, and the one function that declares it.

    saga.commands  (topic) ──command.<participant>.#──▶ <participant>.commands ─┐
    saga.replies   (direct) ──reply.saga.v1──────────▶ saga.replies ───────────┤ dead-letter
    saga.retry     (direct) ──<queue>.retry.<n>s─────▶ <queue>.retry.<n>s      │
                              (TTL n s, then back to <queue> by the default     │
                               exchange)                                        │
    saga.dlx       (topic)  ──#──────────────────────▶ saga.dead_letter ◀───────┘
    saga.parking   (direct) ──saga.parking_lot───────▶ saga.parking_lot
    (default)                                          saga.maintenance (beat's tasks)

Queue arguments cannot change once a queue exists, so they are fixed here from the
first day. Names come from pure functions; ``declare`` is idempotent and turns an
argument mismatch into a ``TopologyMismatch`` naming the queue, instead of the
broker's channel error that otherwise stops a worker.

Queue type: classic by default. On one RabbitMQ 3.10 node a quorum queue brings no
replication, and a single quorum queue in Celery's ``task_queues`` switches the whole
app to per-consumer QoS and native delayed delivery. ``SAGA_QUEUE_TYPE=quorum`` is
for clusters; it adds ``x-delivery-limit`` and at-least-once dead-lettering.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from amqp.exceptions import NotFound, PreconditionFailed
from kombu import Connection, Exchange, Queue

from saga_tasks.errors import ServiceUnavailable, TopologyMismatch

COMMANDS_EXCHANGE = Exchange("saga.commands", type="topic", durable=True)
REPLIES_EXCHANGE = Exchange("saga.replies", type="direct", durable=True)
RETRY_EXCHANGE = Exchange("saga.retry", type="direct", durable=True)
DEAD_LETTER_EXCHANGE = Exchange("saga.dlx", type="topic", durable=True)
PARKING_EXCHANGE = Exchange("saga.parking", type="direct", durable=True)

REPLY_QUEUE = "saga.replies"
REPLY_ROUTING_KEY = "reply.saga.v1"
MAINTENANCE_QUEUE = "saga.maintenance"
DEAD_LETTER_QUEUE = "saga.dead_letter"
PARKING_QUEUE = "saga.parking_lot"
RETRY_TIERS: tuple[int, ...] = (1, 10, 60)
"""Delays, in seconds, of the retry queues behind every work queue."""
QUORUM_DELIVERY_LIMIT = 5
"""Deliveries of one message before a quorum queue dead-letters it (poison bound)."""


def command_queue(participant: str) -> str:
    return f"{participant}.commands"


def participant_of(queue: str) -> str:
    return queue.removesuffix(".commands")


def retry_queue(queue: str, seconds: int) -> str:
    return f"{queue}.retry.{seconds}s"


def command_routing_key(queue: str, task_name: str) -> str:
    """Stable dimensions: who, what, which version, e.g. ``command.inventory.reserve.v1``."""
    action = task_name.rsplit(".", 1)[-1]
    return f"command.{participant_of(queue)}.{action}.v1"


def command_key_prefix(queue: str) -> str:
    """What every routing key of ``queue``'s commands starts with."""
    return f"command.{participant_of(queue)}."


def _binding(queue: str) -> str:
    return f"{command_key_prefix(queue)}#"


@dataclass(frozen=True)
class Topology:
    """Every exchange and queue of one deployment, given its command queues."""

    command_queues: tuple[str, ...]
    queue_type: str = "classic"
    retry_tiers: tuple[int, ...] = RETRY_TIERS
    declare_on_use: bool = True
    """False where the deploy step declares the topology and no service may configure it
    (one broker user per service): Celery's consumers and our publishers then never
    declare (kombu ``no_declare``), workers only check it passively (``check``), and
    ``declare`` is the deploy step's."""
    _queues: dict[str, Queue] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_queues", self._build(no_declare=not self.declare_on_use))

    def _build(self, *, no_declare: bool) -> dict[str, Queue]:
        queues: dict[str, Queue] = {}

        def add(name: str, exchange: Exchange, routing_key: str, args: dict[str, Any]) -> None:
            queues[name] = Queue(
                name,
                exchange,
                routing_key=routing_key,
                durable=True,
                queue_arguments=args,
                no_declare=no_declare,
            )

        for name in self.command_queues:
            add(name, COMMANDS_EXCHANGE, _binding(name), self._work_arguments())
        add(REPLY_QUEUE, REPLIES_EXCHANGE, REPLY_ROUTING_KEY, self._work_arguments())
        add(
            MAINTENANCE_QUEUE,
            Exchange(MAINTENANCE_QUEUE, type="direct", durable=True),
            MAINTENANCE_QUEUE,
            {"x-queue-type": self.queue_type},
        )
        for work in (*self.command_queues, REPLY_QUEUE):
            for seconds in self.retry_tiers:
                name = retry_queue(work, seconds)
                add(name, RETRY_EXCHANGE, name, self._retry_arguments(work, seconds))
        add(DEAD_LETTER_QUEUE, DEAD_LETTER_EXCHANGE, "#", self._holding_arguments())
        add(PARKING_QUEUE, PARKING_EXCHANGE, PARKING_QUEUE, self._holding_arguments())
        return queues

    def _work_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "x-queue-type": self.queue_type,
            "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE.name,
        }
        if self.queue_type == "quorum":
            args.update(
                {
                    "x-delivery-limit": QUORUM_DELIVERY_LIMIT,
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                }
            )
        return args

    def _retry_arguments(self, work_queue: str, seconds: int) -> dict[str, Any]:
        args: dict[str, Any] = {
            "x-queue-type": self.queue_type,
            "x-message-ttl": seconds * 1000,
            # Back to the work queue through the default exchange, which routes by name.
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work_queue,
        }
        if self.queue_type == "quorum":
            args.update({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
        return args

    def _holding_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {"x-queue-type": self.queue_type}
        if self.queue_type == "classic":
            # Messages here may wait for days: keep them on disk, not in memory.
            args["x-queue-mode"] = "lazy"
        return args

    # -- lookups --------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        try:
            return self._queues[name]
        except KeyError:
            raise KeyError(f"queue {name!r} is not part of this topology") from None

    def work_queues(self) -> list[Queue]:
        """Queues workers consume: Celery's ``task_queues``."""
        names = (*self.command_queues, REPLY_QUEUE, MAINTENANCE_QUEUE)
        return [self._queues[n] for n in names]

    def all_queues(self) -> Iterator[Queue]:
        return iter(self._queues.values())

    def queue_for(self, exchange: str | None, routing_key: str | None) -> str | None:
        """The work queue a delivery came through, from its exchange and routing key."""
        if not routing_key:
            return None
        if not exchange:
            return routing_key if routing_key in self._queues else None
        if exchange == COMMANDS_EXCHANGE.name:
            parts = routing_key.split(".")
            if len(parts) >= 2 and parts[0] == "command":
                name = command_queue(parts[1])
                return name if name in self._queues else None
            return None
        if exchange == REPLIES_EXCHANGE.name:
            return REPLY_QUEUE
        return None

    def routing_key(self, queue: str, task_name: str) -> str:
        if queue in self.command_queues:
            return command_routing_key(queue, task_name)
        q = self.queue(queue)
        return str(q.routing_key)

    # -- declaration ----------------------------------------------------------------------

    def declare(self, connection: Connection) -> list[str]:
        """Declare every exchange, queue and binding; return the queue names.

        Safe to run any number of times. A queue that exists with other arguments
        raises ``TopologyMismatch`` with the broker's own explanation.
        """
        declared = []
        for q in self._build(no_declare=False).values():
            channel = connection.channel()
            try:
                q(channel).declare()
            except PreconditionFailed as exc:
                raise TopologyMismatch(
                    f"queue {q.name!r} exists on the broker with other arguments "
                    f"({exc.reply_text}); ours are {q.queue_arguments}. Delete it or "
                    "migrate it (RabbitMQ cannot change queue arguments in place)."
                ) from exc
            finally:
                _close_quietly(channel)
            declared.append(q.name)
        return declared

    def check(self, connection: Connection, names: Iterable[str]) -> None:
        """Raise ``TopologyMismatch`` naming the first of ``names`` the broker does not
        have; passive declares, which need no permission (a worker that may not configure
        the topology looks before it consumes)."""
        for name in names:
            channel: Any = connection.channel()
            try:
                channel.queue_declare(queue=name, passive=True)
            except NotFound as exc:
                raise TopologyMismatch(
                    f"queue {name!r} is not declared on the broker; the deploy step declares "
                    "the topology (saga-tasks broker declare, as an administrator)"
                ) from exc
            finally:
                _close_quietly(channel)


def _close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - a channel the broker already closed
        return


def declare_topology(broker_url: str, topology: Topology) -> list[str]:
    """Connect to the broker and declare ``topology``; errors name the broker's URL."""
    with Connection(broker_url, connect_timeout=5) as conn:
        try:
            conn.ensure_connection(max_retries=1)
        except Exception as exc:
            raise ServiceUnavailable("RabbitMQ", broker_url, exc) from exc
        return topology.declare(conn)
