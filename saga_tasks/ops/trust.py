"""The trust matrix: what each credential of a deployment may make happen, by message.

One row per action a message can ask for, one column per kind of credential the deploy
step makes (``saga-tasks broker users``): the orchestrator's user, a participant's (about
its own queue and steps, and about another participant's), and the administrator that
deploys. Each cell is what happens: the broker refuses it, the worker that consumes it
refuses it (parked with the reason, nothing changes), it is held and moves nothing, or it
is allowed. The README's matrix is rendered from this table (``markdown``), and
``tests/integration/test_trust_matrix.py`` performs every cell against a real RabbitMQ
with the users ``broker users`` makes, for every participant of the example, and checks
the outcome. What an API token may do is the API's own table (``saga_tasks.web``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    ALLOWED = "allowed"
    BROKER = "refused by the broker"
    WORKER = "parked by the worker"
    """The broker delivers it; the worker consuming it refuses it, parks it with the
    reason and changes nothing."""
    HELD = "held, moves nothing"
    """Stored as a held message (not attested), noted on its saga, moves nothing."""


class Credential(StrEnum):
    ORCHESTRATOR = "orchestrator"
    OWN = "participant, its own"
    OTHER = "participant, another's"
    ADMINISTRATOR = "administrator"


@dataclass(frozen=True)
class Row:
    key: str
    """A stable name: the test performs the action it names."""
    text: str
    """The action, for people: "own" and "another's" refer to the participant column."""
    orchestrator: Verdict
    own: Verdict
    other: Verdict
    administrator: Verdict

    def verdict(self, credential: Credential) -> Verdict:
        return {
            Credential.ORCHESTRATOR: self.orchestrator,
            Credential.OWN: self.own,
            Credential.OTHER: self.other,
            Credential.ADMINISTRATOR: self.administrator,
        }[credential]


A, B, W, H = Verdict.ALLOWED, Verdict.BROKER, Verdict.WORKER, Verdict.HELD

MATRIX: tuple[Row, ...] = (
    # -- read ----------------------------------------------------------------------------
    Row("read.commands", "read a participant's command queue", B, A, B, A),
    Row("read.replies", "read the reply queue", A, B, B, A),
    Row("read.maintenance", "read the maintenance queue", A, B, B, A),
    Row("read.dead_letter", "read the dead-letter queue", A, B, B, A),
    Row("read.parking", "read the parking lot", A, B, B, A),
    Row("read.retry", "read a retry tier", B, B, B, A),
    # -- publish to the broker -----------------------------------------------------------
    Row("publish.commands", "publish to a participant's command routing keys", A, A, B, A),
    Row("publish.by_name", "publish to a command queue by name (default exchange)", A, B, B, A),
    Row("publish.maintenance", "publish to the maintenance queue", A, B, B, A),
    Row("publish.remote_control", "send Celery remote control (celery.pidbox)", A, B, B, A),
    Row("publish.as_another", "publish naming another user (AMQP user_id)", B, B, B, B),
    Row("configure.queue", "declare or delete a saga queue", B, B, B, A),
    # -- what a worker does with it ------------------------------------------------------
    Row("reply.step", "answer a participant's step (a reply)", A, A, W, W),
    Row("command.retry_tier", "route a command into a participant's retry tier", A, A, W, W),
    Row("task.not_its_queue", "run a task not the queue's own on the reply queue", W, W, W, W),
    Row("task.follow_up", "attach follow-up work (chain, callbacks, group) to a reply", W, W, W, W),
    Row("dead_letter.step", "dead-letter a message of a participant's step", A, A, H, H),
    Row("park", "park a message (the parking lot)", H, H, H, H),
)
"""The rows, in the order the README shows them."""


def markdown(matrix: tuple[Row, ...] = MATRIX) -> str:
    """The matrix as a Markdown table (the README's)."""
    columns = list(Credential)
    lines = [
        "| action | " + " | ".join(c.value for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in matrix:
        cells = [row.verdict(c).value for c in columns]
        lines.append(f"| {row.text} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SCOPES = ("read", "operate", "start")
"""The API's scopes (``saga_tasks.web.auth``), in the README's column order."""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    scope: str | None
    """The scope a token needs; None: open to anyone (health, metrics, the API's docs)."""
    text: str

    def answer(self, scopes: frozenset[str] | None, *, public_read: bool = False) -> str:
        """What a caller with ``scopes`` (None: no token) gets: ``allowed``, 401 or 403.
        With public reads on, reads are open to anyone, with or without a token."""
        if self.scope is None or (public_read and self.scope == "read"):
            return "allowed"
        if scopes is None:
            return "401"
        return "allowed" if self.scope in scopes else "403"


ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", None, "liveness, and whether PostgreSQL answers"),
    Route("GET", "/metrics", None, "Prometheus counters and gauges, no ids or payloads"),
    Route("GET", "/openapi.json", None, "the API's description"),
    Route("GET", "/docs", None, "Swagger UI"),
    Route("POST", "/sagas/{saga_type}", "start", "start a saga"),
    Route("GET", "/sagas", "read", "list sagas, stuck ones"),
    Route("GET", "/sagas/{saga_id}", "read", "one saga: steps and history"),
    Route("GET", "/schedules", "read", "the schedules and their last runs"),
    Route("GET", "/held", "read", "held messages, without bodies"),
    Route("GET", "/held/{held_id}", "read", "one held message; its body needs operate too"),
    Route("POST", "/sagas/{saga_id}/{action}", "operate", "an operator action"),
    Route("POST", "/sagas/{saga_id}/migrate", "operate", "move a saga to another version"),
    Route("POST", "/sagas/{saga_id}/steps/{step}/signal", "operate", "decide a human step"),
    Route("POST", "/held/{held_id}/{verb}", "operate", "replay or discard a held message"),
    Route("GET", "/", "read", "the dashboard's overview"),
    Route("GET", "/ui/sagas/{saga_id}", "read", "the dashboard's saga page"),
    Route("GET", "/ui/held", "read", "the dashboard's held messages"),
    Route("GET", "/ui/schedules", "read", "the dashboard's schedules"),
)
"""Every route the web app serves (static assets and the docs' assets aside)."""


def routes_markdown(routes: tuple[Route, ...] = ROUTES) -> str:
    """The routes as a Markdown table (the README's): what each caller gets."""
    lines = [
        "| route | what | no token | " + " | ".join(f"`{s}` alone" for s in SCOPES) + " |",
        "|---|---|---|" + "---|" * len(SCOPES),
    ]
    for route in routes:
        cells = [route.answer(None)] + [route.answer(frozenset({s})) for s in SCOPES]
        name = f"`{route.method} {route.path}`"
        lines.append(f"| {name} | {route.text} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = [
    "MATRIX",
    "ROUTES",
    "SCOPES",
    "Credential",
    "Route",
    "Row",
    "Verdict",
    "markdown",
    "routes_markdown",
]
