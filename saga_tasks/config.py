"""One typed settings object, read from the environment once, with local defaults.

Every field names its environment variable and says what it is for; the README's
configuration table is checked against this module by a test.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, TypeVar

from saga_tasks.errors import (
    ConfigurationError,
    WebhookRefused,
)
from saga_tasks.observability import webhook
from saga_tasks.urls import malformed, mask_url

T = TypeVar("T")

_NAMED_URL = re.compile(r"^(?P<name>[A-Za-z_*][A-Za-z0-9_]*)=(?P<url>\S+://\S*)$")

BEAT_LEASE_MARGIN = 3
"""The beat lease lasts at least this many of beat's longest sleeps. Redbeat renews the
lease once per tick, so it must outlive one sleep plus the tick's own work (Redis round
trips, publishing the due tasks with confirms); a lease that lapses makes the next renewal
raise ``LockNotOwnedError``, which stops beat, and no timeout or recovery runs after it."""

API_SCOPES = frozenset({"read", "operate", "start"})
"""What an HTTP API token may do: read sagas and held messages, operate on them, start
sagas. None implies another; an entry of ``SAGA_API_TOKENS`` that names none has all."""

BEAT_MIN_SLEEP = 1.0
"""Floor of beat's longest sleep between ticks (``beat_max_loop_interval``): sub-second
intervals still tick about once a second, instead of spinning."""


def _env(name: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": name, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """Configuration of every saga_tasks process."""

    database_url: str = _env(
        "SAGA_DATABASE_URL",
        "postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/saga_tasks",
        "PostgreSQL of the orchestrator: sagas, their history, outbox and inbox (may be empty "
        "in a participant's own process, which never opens it).",
    )
    participant_database_url: str = _env(
        "SAGA_PARTICIPANT_DATABASE_URL",
        "",
        "PostgreSQL of the participants this process runs or reads: one URL, where "
        "{participant} stands for each participant's name (one database each), or "
        "name=URL entries separated by spaces. Empty: SAGA_DATABASE_URL (one database, "
        "a schema per participant).",
    )
    broker_url: str = _env(
        "SAGA_BROKER_URL",
        "amqp://guest:guest@127.0.0.1:5672//",
        "RabbitMQ carrying commands and replies.",
    )
    broker_user_prefix: str = _env(
        "SAGA_BROKER_USER_PREFIX",
        "",
        "Set (e.g. saga-): one RabbitMQ user per service, <prefix>orchestrator and "
        "<prefix><participant>, and every message must come from the right one; empty: one "
        "user for all (development: the broker is then no trust boundary).",
    )
    result_backend: str = _env(
        "SAGA_RESULT_BACKEND",
        "redis://127.0.0.1:6379/0",
        "Redis: Celery's result backend, and beat's schedule state and lease (keys "
        "saga_tasks:beat:<digest of the database and vhost>:*, so deployments sharing one "
        "Redis never meet; they stay after beat stops, for the next beat). Saga state never "
        "lives here.",
    )
    queue_type: str = _env(
        "SAGA_QUEUE_TYPE",
        "classic",
        "RabbitMQ queue type of every saga queue: classic or quorum. Fixed once declared.",
    )
    relay_interval: float = _env(
        "SAGA_RELAY_INTERVAL",
        2.0,
        "Seconds between outbox recovery passes: beat's over the orchestrator's outbox, "
        "each participant worker's over its participant's own.",
    )
    relay_min_age: float = _env(
        "SAGA_RELAY_MIN_AGE",
        5.0,
        "An outbox row is republished by recovery once it is this many seconds old.",
    )
    relay_batch: int = _env(
        "SAGA_RELAY_BATCH",
        500,
        "Outbox rows claimed per recovery pass and outbox; at least 1.",
    )
    sweep_interval: float = _env(
        "SAGA_SWEEP_INTERVAL",
        2.0,
        "Seconds between timeout sweeps run by beat.",
    )
    max_in_flight: str = _env(
        "SAGA_MAX_IN_FLIGHT",
        "32",
        "Commands each participant queue may have sent and unanswered at once; more wait "
        "in PostgreSQL and go out as answers come. A number for every queue, or "
        "name=N entries (a participant or queue name; * for the rest); 0: no limit.",
    )
    rate_limit: str = _env(
        "SAGA_RATE_LIMIT",
        "",
        "Commands per second sent to a participant queue, in the same form as "
        "SAGA_MAX_IN_FLIGHT; empty or 0: no limit.",
    )
    max_active: str = _env(
        "SAGA_MAX_ACTIVE",
        "",
        "Admission control: a start is refused (429, SagaOverloaded) while this many "
        "sagas of its type are active; a number, or type=N entries; empty: no limit.",
    )
    max_waiting: int = _env(
        "SAGA_MAX_WAITING",
        0,
        "Admission control: a start is refused while a queue its saga sends to holds this "
        "many commands waiting for capacity; 0: no limit.",
    )
    sweep_batch: int = _env(
        "SAGA_SWEEP_BATCH",
        500,
        "Sagas with a passed deadline claimed per sweep transaction; at least 1.",
    )
    beat_lock_timeout: float = _env(
        "SAGA_BEAT_LOCK_TIMEOUT",
        10.0,
        "Seconds (whole) the active beat's lease in Redis lasts; a standby takes over after "
        "it. At least 3 x beat's longest sleep, max(1, min(SAGA_SWEEP_INTERVAL, "
        "SAGA_RELAY_INTERVAL)), so the lease never lapses between two renewals.",
    )
    retry_tiers: str = _env(
        "SAGA_RETRY_TIERS",
        "1,10,60",
        "Delays in seconds of the retry queues, one TTL queue per tier; fixed once declared.",
    )
    unknown_error_retries: int = _env(
        "SAGA_UNKNOWN_ERROR_RETRIES",
        2,
        "Retries, through the tiers, of a message whose handler raised an unexpected error.",
    )
    poison_limit: int = _env(
        "SAGA_POISON_LIMIT",
        3,
        "Redeliveries of one message (its worker died each time) before it is dead-lettered.",
    )
    intake_interval: float = _env(
        "SAGA_INTAKE_INTERVAL",
        2.0,
        "Seconds between passes that move dead-lettered and parked messages into the database.",
    )
    stuck_after: float = _env(
        "SAGA_STUCK_AFTER",
        300.0,
        "An active saga with no change for this many seconds is listed as stuck.",
    )
    replay_max_age: float = _env(
        "SAGA_REPLAY_MAX_AGE",
        86400.0,
        "A held message older than this many seconds is not replayed without --force.",
    )
    alert_interval: float = _env(
        "SAGA_ALERT_INTERVAL",
        30.0,
        "Seconds between scans for stuck sagas and sagas in manual review to alert on.",
    )
    sample_interval: float = _env(
        "SAGA_SAMPLE_INTERVAL",
        60.0,
        "Seconds between samples of how many sagas are in each status (the dashboard's "
        "counts over time); each sample counts the saga table once.",
    )
    sample_keep: float = _env(
        "SAGA_SAMPLE_KEEP",
        604800.0,
        "Seconds samples of counts are kept (default a week); at least 2 x SAGA_SAMPLE_INTERVAL.",
    )
    retention_days: float = _env(
        "SAGA_RETENTION_DAYS",
        0.0,
        "Days a finished saga (COMPLETED, COMPENSATED, FAILED, or resolved so) is kept "
        "after it finished, with its steps, history and held messages; then housekeeping "
        "purges it, leaving a tombstone, and its business key may start a new saga. Sagas "
        "active or in review are never purged. 0 (the default, so an upgrade deletes "
        "nothing): kept forever; 30 is a common choice. At least SAGA_REPLAY_MAX_AGE.",
    )
    purge_batch: int = _env(
        "SAGA_PURGE_BATCH",
        500,
        "Sagas purged per transaction (housekeeping and saga-tasks purge); at least 1.",
    )
    alert_webhook: str = _env(
        "SAGA_ALERT_WEBHOOK",
        "",
        "http(s) URL that receives each alert as a JSON POST (empty: alerts are log lines "
        "only); no credentials in it, never a redirect followed, never to a loopback, "
        "link-local or unspecified address (its host's every address is checked).",
    )
    alert_webhook_allow_local: bool = _env(
        "SAGA_ALERT_WEBHOOK_ALLOW_LOCAL",
        False,
        "1 lets SAGA_ALERT_WEBHOOK reach loopback and link-local addresses (a webhook server "
        "on this host); otherwise refused, so that no URL, name or redirect makes the "
        "alerter a client of this host's services or a cloud's metadata endpoint.",
    )
    api_tokens: str = _env(
        "SAGA_API_TOKENS",
        "",
        "HTTP API tokens, comma-separated actor:token:scopes entries, scopes joined by + "
        "(read, operate, start); actor:token alone has all three. Each token at least 16 "
        "characters (openssl rand -hex 16). Never logged.",
    )
    api_public_read: bool = _env(
        "SAGA_API_PUBLIC_READ",
        False,
        "1 lets HTTP reads through without a token, redacted as for the read scope: only on "
        "a private network.",
    )
    redact_fields: str = _env(
        "SAGA_REDACT_FIELDS",
        "password,secret,token,authorization,api_key,card,cvv,iban,email,phone,address",
        "Field names whose values the HTTP API masks in held messages, comma-separated; a "
        "key matches when these words appear in it (any case, _ - or camelCase).",
    )
    api_base_url: str = _env(
        "SAGA_API_BASE_URL",
        "",
        "Public base URL of the HTTP API (https://sagas.example.com); status_url is built "
        "from it, never from the request's Host header (empty: a path).",
    )
    api_max_body: int = _env(
        "SAGA_API_MAX_BODY",
        1_048_576,
        "Largest request body the HTTP API reads, in bytes; a larger one gets 413 unread.",
    )
    metrics_port: int = _env(
        "SAGA_METRICS_PORT",
        0,
        "Port (1-65535) on which a worker serves Prometheus metrics (0: none; the web app has "
        "/metrics).",
    )
    trace_export: str = _env(
        "SAGA_TRACE_EXPORT",
        "off",
        "OpenTelemetry spans: off, console, or file:<path> (JSON lines); needs the otel extra.",
    )
    publish_timeout: float = _env(
        "SAGA_PUBLISH_TIMEOUT",
        5.0,
        "Seconds to wait for the broker to confirm one publish.",
    )
    publish_mode: str = _env(
        "SAGA_PUBLISH_MODE",
        "async",
        "async: a sender thread publishes committed messages and marks them; the task "
        "does not wait. sync: each task waits for the confirms and the marking.",
    )
    mark_interval: float = _env(
        "SAGA_MARK_INTERVAL",
        0.25,
        "Seconds the sender thread gathers confirmed publishes before marking them published "
        "(one UPDATE per outbox); below SAGA_RELAY_MIN_AGE, so recovery never races it.",
    )
    task_events: bool = _env(
        "SAGA_TASK_EVENTS",
        False,
        "1 makes workers send Celery task events (Flower's task pages), as worker -E does; "
        "each is one more confirmed publish per task state.",
    )
    db_pool_size: int = _env(
        "SAGA_DB_POOL_SIZE",
        2,
        "PostgreSQL connections per process (each prefork child is a process); at least 1.",
    )
    db_prepare: bool = _env(
        "SAGA_DB_PREPARE",
        True,
        "1 prepares the hot statements once per connection (PostgreSQL plans them once); "
        "0 behind a PgBouncer in transaction pooling mode.",
    )
    prefetch_multiplier: int = _env(
        "SAGA_PREFETCH_MULTIPLIER",
        4,
        "Unacknowledged messages a worker process may hold, per pool slot; at least 1.",
    )
    group_commit: bool = _env(
        "SAGA_GROUP_COMMIT",
        True,
        "0 runs every reply and command as its own Celery task and transaction, whatever "
        "SAGA_REPLY_BATCH and the participants' batch= say (every message then shows in "
        "Flower).",
    )
    reply_batch: int = _env(
        "SAGA_REPLY_BATCH",
        16,
        "Replies an orchestrator worker applies in one transaction (group commit), out of "
        "those it holds (its prefetch bounds a batch); 1 applies each as its own Celery "
        "task, as Flower shows them.",
    )
    log_format: str = _env(
        "SAGA_LOG_FORMAT",
        "text",
        "text for people, json for log pipelines.",
    )
    log_level: str = _env("SAGA_LOG_LEVEL", "INFO", "Level of saga_tasks loggers.")
    app: str = _env(
        "SAGA_TASKS_APP",
        "",
        "module:attribute of the SagaApp (definitions and participants) the CLI, the web app "
        "and start_saga load; no default: a library cannot guess your app.",
    )

    def __post_init__(self) -> None:
        self._check_urls()
        self._check_words()
        self.tokens()
        for limits in ("max_in_flight", "rate_limit", "max_active"):
            self.queue_limits(limits)
        self._check_seconds()
        self._check_bounds()

    def _check_urls(self) -> None:
        """Every URL parses (a password stays out of the error)."""
        if self.database_url or not self.participants_apart:
            # Empty only in a participant's own process: it never opens the saga database.
            check_url("SAGA_DATABASE_URL", self.database_url)
        for url in self._participant_urls().values():
            check_url("SAGA_PARTICIPANT_DATABASE_URL", url.replace("{participant}", "p"))
        check_url("SAGA_BROKER_URL", self.broker_url, failover=True)
        check_url("SAGA_RESULT_BACKEND", self.result_backend)
        if self.api_base_url and not self.api_base_url.startswith(("http://", "https://")):
            raise ConfigurationError("SAGA_API_BASE_URL must be an http(s) URL or empty")

    def _check_words(self) -> None:
        """Settings that take one of a few words, or a word of a few characters."""
        if not re.fullmatch(r"[A-Za-z0-9._-]*", self.broker_user_prefix):
            raise ConfigurationError("SAGA_BROKER_USER_PREFIX: letters, digits, '.', '_', '-'")
        if self.queue_type not in ("classic", "quorum"):
            raise ConfigurationError(
                f"SAGA_QUEUE_TYPE must be 'classic' or 'quorum', not {self.queue_type!r}"
            )
        _tiers(self.retry_tiers)
        if self.unknown_error_retries < 0 or self.poison_limit < 1:
            raise ConfigurationError(
                "SAGA_UNKNOWN_ERROR_RETRIES must be >= 0 and SAGA_POISON_LIMIT >= 1"
            )
        if not (
            self.trace_export in ("off", "console")
            or (self.trace_export.startswith("file:") and self.trace_export[5:].strip())
        ):
            raise ConfigurationError("SAGA_TRACE_EXPORT must be off, console or file:<path>")
        if self.publish_mode not in ("async", "sync"):
            raise ConfigurationError(
                f"SAGA_PUBLISH_MODE must be 'async' or 'sync', not {self.publish_mode!r}"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigurationError(
                f"SAGA_LOG_FORMAT must be 'text' or 'json', not {self.log_format!r}"
            )

    def _check_seconds(self) -> None:
        """Intervals and ages: finite, positive, and in the order they must keep."""
        for name in (
            "mark_interval",
            "relay_interval",
            "relay_min_age",
            "publish_timeout",
            "sweep_interval",
            "beat_lock_timeout",
            "intake_interval",
            "stuck_after",
            "replay_max_age",
            "alert_interval",
            "sample_interval",
            "sample_keep",
        ):
            value = getattr(self, name)
            # nan passes every comparison below, and an infinite interval or age is "never".
            if not math.isfinite(value):
                raise ConfigurationError(
                    f"{_env_name(name)}={value} must be a finite number of seconds"
                )
            if value <= 0:
                raise ConfigurationError(f"{_env_name(name)} must be positive")
        if self.mark_interval >= self.relay_min_age:
            raise ConfigurationError("SAGA_MARK_INTERVAL must be below SAGA_RELAY_MIN_AGE")

    def _check_bounds(self) -> None:
        """Values that parse and look sane but switch a guarantee off without a word."""
        if self.max_waiting < 0:
            raise ConfigurationError("SAGA_MAX_WAITING must be 0 (no limit) or more")
        if self.api_max_body < 1024:
            raise ConfigurationError("SAGA_API_MAX_BODY must be at least 1024 bytes")
        for name, why in (
            # LIMIT 0 claims nothing (no timeout fires, nothing is recovered); a negative
            # LIMIT fails every pass.
            ("sweep_batch", "a sweep that claims no saga never fires a timeout"),
            ("relay_batch", "a recovery pass that claims no row never republishes one"),
            # SQLAlchemy reads 0 as "no limit" (and the overflow as unbounded).
            ("db_pool_size", "0 or less would mean no bound on connections"),
            # Celery reads 0 as "unlimited": a worker would take its whole queue.
            ("prefetch_multiplier", "0 would let a worker take its whole queue"),
            ("reply_batch", "a batch of no replies applies none"),
            ("purge_batch", "a purge of no saga never ends the ones due"),
        ):
            value = getattr(self, name)
            if value < 1:
                raise ConfigurationError(f"{_env_name(name)}={value} must be at least 1: {why}")
        lease_bound = math.ceil(BEAT_LEASE_MARGIN * self.beat_max_interval)
        if self.beat_lease < lease_bound:
            whole = (
                ""
                if self.beat_lease == self.beat_lock_timeout
                else f" ({self.beat_lease} s: redbeat counts whole seconds)"
            )
            raise ConfigurationError(
                f"SAGA_BEAT_LOCK_TIMEOUT={self.beat_lock_timeout}{whole} must be at least "
                f"{lease_bound} s: {BEAT_LEASE_MARGIN} x beat's longest sleep between lease "
                f"renewals, max({BEAT_MIN_SLEEP:g}, min(SAGA_SWEEP_INTERVAL, "
                f"SAGA_RELAY_INTERVAL)) = {self.beat_max_interval:g} s; a shorter lease lapses "
                "while beat sleeps or works, and beat stops with LockNotOwnedError"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(
                f"SAGA_METRICS_PORT={self.metrics_port} must be 0 (none) or a port, 0 to 65535"
            )
        if not math.isfinite(self.retention_days) or self.retention_days < 0:
            raise ConfigurationError("SAGA_RETENTION_DAYS must be 0 (kept forever) or more days")
        if 0 < self.retention_days * 86400 < self.replay_max_age:
            raise ConfigurationError(
                f"SAGA_RETENTION_DAYS={self.retention_days} is shorter than "
                f"SAGA_REPLAY_MAX_AGE={self.replay_max_age} s: a held message could be "
                "replayed into a saga already purged"
            )
        if self.sample_keep < 2 * self.sample_interval:
            raise ConfigurationError(
                f"SAGA_SAMPLE_KEEP={self.sample_keep} must be at least 2 x SAGA_SAMPLE_INTERVAL "
                f"= {2 * self.sample_interval}: a shorter keep prunes each sample before the "
                "next, and the dashboard's counts over time stay empty"
            )
        if self.alert_webhook:
            try:
                webhook.check_url(
                    self.alert_webhook, allow_local=self.alert_webhook_allow_local, resolve=True
                )
            except WebhookRefused as refused:
                raise WebhookRefused(f"SAGA_ALERT_WEBHOOK {refused}") from None

    @property
    def beat_max_interval(self) -> float:
        """Beat's longest sleep between two ticks (Celery's ``beat_max_loop_interval``):
        redbeat renews its lease once per tick, so at least this often."""
        return max(BEAT_MIN_SLEEP, min(self.sweep_interval, self.relay_interval))

    @property
    def beat_lease(self) -> int:
        """``SAGA_BEAT_LOCK_TIMEOUT`` as redbeat uses it: whole seconds."""
        return int(self.beat_lock_timeout)

    def _participant_urls(self) -> dict[str, str]:
        """``SAGA_PARTICIPANT_DATABASE_URL`` as name -> URL; ``*`` for every other name.
        Parsed once: every command a participant handles asks for its database."""
        return dict(self._parsed_participant_urls)

    @cached_property
    def _parsed_participant_urls(self) -> dict[str, str]:
        value = self.participant_database_url.strip()
        if not value:
            return {}
        entries = value.split()
        if len(entries) == 1 and not _NAMED_URL.match(entries[0]):
            return {"*": entries[0]}
        found: dict[str, str] = {}
        for entry in entries:
            named = _NAMED_URL.match(entry)
            if named is None or named["name"] in found:
                raise ConfigurationError(
                    "SAGA_PARTICIPANT_DATABASE_URL: one URL, or name=URL entries separated by "
                    f"spaces, each name once (not {_piece(entry)!r})"
                )
            found[named["name"]] = named["url"]
        return found

    def participant_database(self, name: str) -> str:
        """The database URL of participant ``name`` as this process sees it."""
        urls = self._participant_urls()
        url = urls.get(name) or urls.get("*")
        if url is None:
            if urls:
                raise ConfigurationError(
                    f"SAGA_PARTICIPANT_DATABASE_URL names no database for participant {name!r}"
                )
            return self.database_url
        return url.replace("{participant}", name)

    def named_participant_databases(self) -> list[str]:
        """The participant database URLs ``SAGA_PARTICIPANT_DATABASE_URL`` names outright
        (a ``{participant}`` template names none until given a participant)."""
        urls = self._participant_urls().values()
        return list(dict.fromkeys(u for u in urls if "{participant}" not in u))

    @property
    def participants_apart(self) -> bool:
        """True when participants have databases of their own (not the orchestrator's)."""
        return bool(self._participant_urls())

    def queue_limits(self, name: str) -> dict[str, float]:
        """``SAGA_MAX_IN_FLIGHT``, ``SAGA_RATE_LIMIT`` or ``SAGA_MAX_ACTIVE`` (by field
        ``name``) as name -> number, ``*`` for every other name."""
        return dict(_numbers(_env_name(name), getattr(self, name)))

    def tokens(self) -> dict[str, tuple[str, frozenset[str]]]:
        """``SAGA_API_TOKENS`` as token -> (actor, scopes). Errors name the actor, never
        the token (a token cannot contain ``:``; part of one may sit where scopes go)."""
        found: dict[str, tuple[str, frozenset[str]]] = {}
        for entry in filter(None, (p.strip() for p in self.api_tokens.split(","))):
            actor, sep, rest = (part.strip() for part in entry.partition(":"))
            token, has_scopes, named = (part.strip() for part in rest.partition(":"))
            if not sep or not actor or len(token) < 16:
                raise ConfigurationError(
                    "SAGA_API_TOKENS: actor:token[:scope+scope] entries, each token at least "
                    "16 characters"
                )
            scopes = frozenset(s.strip() for s in named.split("+")) if has_scopes else API_SCOPES
            if not scopes <= API_SCOPES:
                raise ConfigurationError(
                    f"SAGA_API_TOKENS: the entry of {actor!r} names a scope other than read, "
                    "operate and start (joined by +; a token cannot contain ':')"
                )
            found[token] = (actor, scopes)
        return found

    def __repr__(self) -> str:
        shown = {
            f.name: (
                "***" if f.name == "api_tokens" and getattr(self, f.name) else getattr(self, f.name)
            )
            for f in fields(self)
        }
        shown["database_url"] = mask_url(self.database_url)
        shown["participant_database_url"] = " ".join(
            mask_url(u) for u in self.participant_database_url.split()
        )
        shown["broker_url"] = mask_url(self.broker_url)
        shown["result_backend"] = mask_url(self.result_backend)
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def retry_delays(self) -> tuple[int, ...]:
        """``SAGA_RETRY_TIERS`` as whole seconds, ascending."""
        return _tiers(self.retry_tiers)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every field from ``env`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.metadata.get("env")
            if name is None or name not in env:
                continue
            values[f.name] = _parse(type(f.default), env[name], name)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def documented(cls) -> list[tuple[str, str, str]]:
        """``(variable, default, meaning)`` for each setting, for docs and tests."""
        return [
            (f.metadata["env"], str(f.default), f.metadata["doc"])
            for f in fields(cls)
            if "env" in f.metadata
        ]


_NAMED_NUMBER = re.compile(r"^(?P<name>[A-Za-z_*][A-Za-z0-9_.-]*)=(?P<value>[0-9.]+)$")


def _numbers(env: str, raw: str) -> dict[str, float]:
    """A number for every name, or ``name=N`` entries separated by spaces."""
    entries = raw.split()
    found: dict[str, float] = {}
    for entry in entries:
        named = _NAMED_NUMBER.match(entry)
        name, value = (named["name"], named["value"]) if named else ("*", entry)
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if name in found or not math.isfinite(number) or number < 0:
            raise ConfigurationError(
                f"{env}: a number, or name=N entries separated by spaces, each name once "
                f"(not {_piece(entry)!r})"
            )
        found[name] = number
    return found


def _tiers(raw: str) -> tuple[int, ...]:
    try:
        tiers = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigurationError(
            f"SAGA_RETRY_TIERS={raw!r}: whole seconds, comma-separated"
        ) from None
    if not tiers or any(t < 1 for t in tiers) or len(set(tiers)) != len(tiers):
        raise ConfigurationError(f"SAGA_RETRY_TIERS={raw!r}: distinct whole seconds, at least 1")
    return tuple(sorted(tiers))


def _env_name(field_name: str) -> str:
    for f in fields(Settings):
        if f.name == field_name:
            return str(f.metadata["env"])
    return field_name


def _parse(kind: type, raw: str, name: str) -> Any:
    parsers: dict[type, Callable[[str], Any]] = {
        bool: _parse_bool,
        int: int,
        float: float,
        str: str,
    }
    try:
        return parsers[kind](raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


def _piece(entry: str) -> str:
    """A piece of a setting split at spaces, safe to quote: it may be a URL cut inside its
    password (an unencoded space), even after an ``@`` in it, so of a URL only the scheme
    (and the name before it) shows."""
    scheme, sep, _rest = entry.partition("://")
    if sep:
        return f"{scheme}://..."
    return mask_url(entry)


def check_url(name: str, url: str, *, failover: bool = False) -> None:
    """Refuse, in one line, a setting that is not a URL at all (``scheme://...``), or one
    that is malformed (``malformed``), naming it masked; ``failover``: a ``;``-separated
    list of URLs (a broker's), each checked."""
    for one in url.split(";") if failover else [url]:
        scheme, sep, rest = one.partition("://")
        if not sep or not scheme or not rest or not scheme.replace("+", "").isalnum():
            raise ConfigurationError(f"{name} is not a URL (scheme://...): {mask_url(one)}")
        why = malformed(one)
        if why is not None:
            raise ConfigurationError(f"{name} is malformed: {why}: {mask_url(one)}")
