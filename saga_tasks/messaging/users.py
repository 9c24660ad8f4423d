"""The broker users of a deployment and what each may do: RabbitMQ permissions as values.

RabbitMQ grants a user, per vhost, three regular expressions over exchange and queue
names (one namespace for both): *configure* (declare, delete), *write* (publish to an
exchange; bind a queue) and *read* (consume from a queue; bind to an exchange), plus,
per topic exchange, a regular expression over the routing keys it may publish with.
With one user per service (``SAGA_BROKER_USER_PREFIX``):

| user            | configure     | write                          | read                        |
|-----------------|---------------|--------------------------------|-----------------------------|
| orchestrator    | control plane,| commands, replies, retry, dlx, | replies, maintenance,       |
|                 | event queues  | parking, maintenance, default  | dead_letter, parking_lot,   |
|                 |               | exchange, control plane,       | control plane, events       |
|                 |               | remote control                 |                             |
| participant *p* | control plane | replies, retry, dlx, parking,  | its own command queue,      |
|                 |               | commands (routing keys         | control plane               |
|                 |               | ``command.<p>.*`` only),       |                             |
|                 |               | control plane, not remote      |                             |
|                 |               | control                        |                             |

No service may configure a saga exchange or queue: only the deploy step does
(``saga-tasks broker declare``, with an administrator). The control plane is Celery's:
each worker's ``<node>.celery.pidbox`` queue on the ``celery.pidbox`` exchange, the
replies of ``celery inspect`` (``reply.celery.pidbox``) and task events (``celeryev``).
Only the orchestrator's user may publish to ``celery.pidbox``, i.e. send remote-control
commands (``shutdown``, ``add_consumer``, ``revoke``): a participant worker must run
``--without-mingle`` (mingle broadcasts a hello there) and ``--without-gossip``, and be
named after its participant (``-n inventory@%h`` or ``-n inventory-2@%h``): it may
consume only its own nodes' ``<node>.celery.pidbox`` queues.

What the control plane still allows a participant, it allows for denial of service only:
the shared exchanges (``celery.pidbox``, ``reply.celery.pidbox``, ``celeryev``) are
declared by every worker, so every worker may configure (delete) them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote

from kombu import Connection

from saga_tasks.core.senders import ORCHESTRATOR_ROLE, Senders
from saga_tasks.messaging.topology import (
    COMMANDS_EXCHANGE,
    DEAD_LETTER_EXCHANGE,
    DEAD_LETTER_QUEUE,
    MAINTENANCE_QUEUE,
    PARKING_EXCHANGE,
    PARKING_QUEUE,
    REPLIES_EXCHANGE,
    REPLY_QUEUE,
    RETRY_EXCHANGE,
    Topology,
    command_key_prefix,
)

DEFAULT_EXCHANGE = "amq.default"
"""How permissions name the default exchange (publishing to a queue by its name)."""
REMOTE_CONTROL = "celery.pidbox"
"""Celery's broadcast exchange of remote-control commands."""
REPLY_CONTROL = "reply.celery.pidbox"
"""Where workers answer ``celery inspect``."""
EVENTS = "celeryev"
"""Celery's task and worker events exchange."""
_PIDBOX = r".+\.celery\.pidbox"
"""Each worker's ``<node>.celery.pidbox`` queue, and ``reply.celery.pidbox`` and the
``<id>.reply.celery.pidbox`` queues of ``celery inspect``; never ``celery.pidbox`` itself."""
_EVENT_QUEUES = r"celeryev\..+"
"""The queues of event receivers (Flower)."""


def broker_user(url: str) -> str:
    """The user a connection to ``url`` logs in as (``guest``, AMQP's default, when it names
    none); of a failover list, the first URL's. Read by hand, as ``mask_url`` does: an
    unencoded ``/``, ``#`` or ``?`` in a password must not make this fail."""
    user, _password = credentials(url.split(";", 1)[0])
    return user or "guest"


def service_url(admin_url: str, user: str, password: str) -> str:
    """``admin_url`` with another user's credentials: the same host, port and vhost."""
    scheme, sep, rest = admin_url.partition("://")
    if not sep:
        raise ValueError("not a broker URL")
    at = rest.rfind("@")
    location = rest[at + 1 :] if at >= 0 else rest
    return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{location}"


def vhost_of(url: str) -> str:
    """The vhost a connection to ``url`` opens (``/`` when it names none)."""
    return str(Connection(url).virtual_host or "/")


def management_api(url: str) -> str:
    """The management API of the broker at ``url``, on its default port."""
    return f"http://{Connection(url).hostname or '127.0.0.1'}:15672/api"


def credentials(url: str) -> tuple[str, str]:
    """(user, password) written in ``url``, decoded; empty strings when absent."""
    _scheme, _sep, rest = url.partition("://")
    at = rest.rfind("@")
    if at < 0:
        return "", ""
    user, _colon, password = rest[:at].partition(":")
    return unquote(user), unquote(password)


@dataclass(frozen=True)
class Grant:
    """What one service user may do on the deployment's vhost."""

    user: str
    service: str
    """``orchestrator``, or the participant's name."""
    configure: str
    write: str
    read: str
    topic_write: tuple[tuple[str, str], ...] = ()
    """(topic exchange, routing keys it may publish with); other topic exchanges: any."""

    @property
    def role(self) -> str:
        return self.service if self.service == ORCHESTRATOR_ROLE else f"participant {self.service}"


def _names(*names: str, patterns: Iterable[str] = ()) -> str:
    """One anchored expression matching exactly these names and patterns."""
    parts = [re.escape(n) for n in names] + list(patterns)
    return "^(" + "|".join(parts) + ")$"


def grants(topology: Topology, senders: Senders) -> list[Grant]:
    """The least each service user needs (see the module docstring), orchestrator first."""
    missing = set(topology.command_queues) - set(senders.participants)
    if missing:
        raise ValueError(f"no participant named for command queues {sorted(missing)}")
    control = (_PIDBOX,)
    orchestrator = Grant(
        user=senders.orchestrator,
        service=ORCHESTRATOR_ROLE,
        configure=_names(REMOTE_CONTROL, EVENTS, patterns=(*control, _EVENT_QUEUES)),
        write=_names(
            COMMANDS_EXCHANGE.name,
            REPLIES_EXCHANGE.name,
            RETRY_EXCHANGE.name,
            DEAD_LETTER_EXCHANGE.name,
            PARKING_EXCHANGE.name,
            MAINTENANCE_QUEUE,
            DEFAULT_EXCHANGE,
            REMOTE_CONTROL,
            EVENTS,
            patterns=(*control, _EVENT_QUEUES),
        ),
        read=_names(
            REPLY_QUEUE,
            MAINTENANCE_QUEUE,
            DEAD_LETTER_QUEUE,
            PARKING_QUEUE,
            REMOTE_CONTROL,
            EVENTS,
            patterns=(*control, _EVENT_QUEUES),
        ),
    )
    found = [orchestrator]
    for user, queue in senders.users().items():
        if queue is None:
            continue
        own_keys = re.escape(command_key_prefix(queue))
        name = senders.participants[queue]
        # Its workers' own pidbox queues only (nodes named <name>@host or <name>-<n>@host):
        # another worker's remote-control messages are not for it to take.
        own_node = rf"{re.escape(name)}(-[^@]*)?@.+\.celery\.pidbox"
        found.append(
            Grant(
                user=user,
                service=name,
                configure=_names(REMOTE_CONTROL, REPLY_CONTROL, EVENTS, patterns=(own_node,)),
                write=_names(
                    REPLIES_EXCHANGE.name,
                    RETRY_EXCHANGE.name,
                    DEAD_LETTER_EXCHANGE.name,
                    PARKING_EXCHANGE.name,
                    # Celery re-sends a task whose pool child was lost to the exchange it
                    # came from; the topic permission below keeps those to its own queue.
                    COMMANDS_EXCHANGE.name,
                    EVENTS,
                    REPLY_CONTROL,
                    patterns=(own_node,),
                ),
                read=_names(queue, REMOTE_CONTROL, patterns=(own_node,)),
                topic_write=((COMMANDS_EXCHANGE.name, f"^{own_keys}"),),
            )
        )
    return found


__all__ = [
    "DEFAULT_EXCHANGE",
    "EVENTS",
    "REMOTE_CONTROL",
    "REPLY_CONTROL",
    "Grant",
    "broker_user",
    "credentials",
    "grants",
    "management_api",
    "service_url",
    "vhost_of",
]
