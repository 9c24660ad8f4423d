"""``SagaApp``: the composition root. Definitions, participants and settings in; every
part that runs them wired once, and the Celery app that carries them.

Built from explicit lists; importing a module registers nothing. One SagaApp serves
every process of a deployment (orchestrator, participant workers, beat, CLI, web):
each worker picks its queue with ``-Q``. Nothing below this module imports it: each
part receives what it uses (an engine, a publisher, the clock, its settings).

    saga_app = SagaApp(sagas=[ORDER_SAGA], participants=[orders, inventory, payments],
                       schedules=[schedule("nightly-refunds", "refunds", cron="0 2 * * *")])
    app = saga_app.celery        # celery -A yourmodule worker -Q saga.replies
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import Engine, Table
from sqlalchemy.orm import Session

from saga_tasks.config import Settings
from saga_tasks.core.clock import Clock, SystemClock
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.registry import Registry
from saga_tasks.core.schedules import Schedule
from saga_tasks.core.senders import Senders
from saga_tasks.core.states import MessageKind
from saga_tasks.errors import (
    ConfigurationError,
    CrossParticipantCompensation,
    DuplicateSchedule,
    InvalidPayload,
    InvalidScheduledPayload,
    ScheduleError,
    UnknownSagaType,
    UnknownScheduledSaga,
)
from saga_tasks.messaging.admin import queue_depths
from saga_tasks.messaging.celery_config import celery_app
from saga_tasks.messaging.dispatcher import Dispatcher
from saga_tasks.messaging.publisher import Publisher, task_message_encoder
from saga_tasks.messaging.topology import REPLY_QUEUE, Topology, participant_of
from saga_tasks.messaging.users import broker_user
from saga_tasks.observability.alerts import AlertScan, alerters_for
from saga_tasks.observability.tracing import Tracing
from saga_tasks.participant import Participant
from saga_tasks.persistence.db import get_engine
from saga_tasks.persistence.tables import redelivery, saga_outbox
from saga_tasks.runtime.admission import Admission
from saga_tasks.runtime.flow import FlowControl, resolve_limits
from saga_tasks.runtime.holding import Holding
from saga_tasks.runtime.hooks import NO_HOOKS, Hooks
from saga_tasks.runtime.intake import Intake
from saga_tasks.runtime.maintenance import Maintenance
from saga_tasks.runtime.orchestrator import Orchestrator, SagaHandle
from saga_tasks.runtime.outlet import Outlet, SyncOutlet
from saga_tasks.runtime.participant import ParticipantRuntime
from saga_tasks.runtime.replay import Replayer
from saga_tasks.runtime.schedules import Timetable
from saga_tasks.runtime.sweeper import Sweeper
from saga_tasks.worker.failures import Counter, FailurePolicy
from saga_tasks.worker.tasks import WorkerParts, register, task_gate


class SagaApp:
    """Everything one deployment of sagas needs, wired once."""

    def __init__(
        self,
        *,
        sagas: Sequence[SagaDefinition],
        participants: Sequence[Participant] = (),
        settings: Settings | None = None,
        clock: Clock | None = None,
        name: str = "saga_tasks",
        migrations: Sequence[str] = (),
        hooks: Hooks = NO_HOOKS,
        schedules: Sequence[Schedule] = (),
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.clock = clock or SystemClock()
        self.name = name
        self.migrations = tuple(migrations)
        """Alembic script directories of the app's own schemas, applied after the
        library's by ``saga-tasks db upgrade``."""
        self.tracing = Tracing(self.settings.trace_export)
        self.hooks = hooks
        """Where the app steps into the runtime's path (the example's demo faults)."""
        self.registry = Registry(sagas)
        self.participants = {p.name: p for p in participants}
        if len(self.participants) != len(participants):
            raise ConfigurationError("two participants share a name")
        _check_owners(sagas, participants)
        self.schedules = _check_schedules(self.registry, schedules)
        """Sagas started on a schedule: beat fires each tick, a maintenance worker starts
        its saga (``saga-tasks schedules`` lists them)."""
        self._owners = {
            id(t): p.name for p in participants for t in (p.ledger, p.outbox, p.redelivery)
        }
        """A participant's own tables by identity: two participants, each in a database
        of its own, may keep their tables under the same schema name."""
        schemas = [p.schema for p in participants]
        self._schema_owners = {
            p.schema: p.name for p in participants if schemas.count(p.schema) == 1
        }
        queues = {p.queue for p in participants} | {q for d in sagas for q in d.queues}
        prefix = self.settings.broker_user_prefix
        self.topology = Topology(
            command_queues=tuple(sorted(queues)),
            queue_type=self.settings.queue_type,
            retry_tiers=self.settings.retry_delays,
            declare_on_use=not prefix,  # one user per service: only the deploy step declares
        )
        consumer = {p.queue: p.name for p in reversed(participants)}
        self.senders = Senders(
            prefix=prefix,
            participants={
                q: consumer.get(q) or participant_of(q) for q in self.topology.command_queues
            },
        )
        """Who may send what on the broker (``SAGA_BROKER_USER_PREFIX``)."""
        self._outlets: dict[int, Outlet] = {}
        self._lock = threading.Lock()
        self._wire()

    def _backlog(self) -> dict[str, int]:
        """Messages a step's answer may be waiting behind, per command queue: those in the
        queue itself, and the replies waiting for the orchestrator (an answer given and
        not yet read is silence too)."""
        depths = queue_depths(
            self.settings.broker_url, [*self.topology.command_queues, REPLY_QUEUE]
        )
        replies = depths.pop(REPLY_QUEUE, 0)
        return {queue: n + replies for queue, n in depths.items()}

    def _wire(self) -> None:
        settings, clock = self.settings, self.clock

        def engine() -> Engine:
            return self.engine

        def publisher() -> Publisher:
            return self.publisher

        def outlet() -> Outlet:
            return self.outlet

        self.flow = FlowControl(
            resolve_limits(
                self.topology.command_queues,
                {
                    p.queue: (p.name, p.max_in_flight, p.rate_limit)
                    for p in reversed(list(self.participants.values()))
                },
                settings.queue_limits("max_in_flight"),
                settings.queue_limits("rate_limit"),
            ),
            clock,
        )
        """Commands each participant queue may have out; the rest wait in PostgreSQL."""
        self.admission = Admission(
            engine,
            max_active=settings.queue_limits("max_active"),
            max_waiting=settings.max_waiting,
        )
        self.orchestrator = Orchestrator(
            engine=engine,
            registry=self.registry,
            topology=self.topology,
            outlet=outlet,
            clock=clock,
            tracing=self.tracing,
            hooks=self.hooks,
            senders=self.senders,
            flow=self.flow,
            admission=self.admission,
        )
        self.sweeper = Sweeper(
            engine=engine,
            registry=self.registry,
            topology=self.topology,
            outlet=outlet,
            clock=clock,
            backlog=self._backlog,
            flow=self.flow,
        )
        self.runtimes = {
            p.name: ParticipantRuntime(
                p,
                engine=self._participant_engine_of(p.name),
                publisher=publisher,
                outlet=outlet,
                clock=clock,
                tracing=self.tracing,
                hooks=self.hooks,
                senders=self.senders,
            )
            for p in self.participants.values()
        }
        self.gate = task_gate(self.topology, self.runtimes)
        """Which task runs on which queue; workers park the rest (``core.gate``)."""
        self.holding = Holding(publisher=publisher, clock=clock)
        self.timetable = Timetable(
            self.schedules, engine=engine, start=self.orchestrator.start, clock=clock
        )
        self.intake = Intake(
            engine=engine,
            publisher=publisher,
            broker_url=settings.broker_url,
            dead_lettered=self.orchestrator.dead_lettered,
            clock=clock,
            senders=self.senders,
            step_queue=self.orchestrator.step_queue,
        )
        self.replayer = Replayer(
            engine=engine,
            publisher=publisher,
            act_in=self.orchestrator.act_in,
            ledgers={
                name: (self._participant_engine_of(name), p.ledger)
                for name, p in self.participants.items()
            },
            max_age=settings.replay_max_age,
            clock=clock,
            gate=self.gate,
            limited=self.flow.limits,
        )
        self.alerts = AlertScan(
            engine=engine,
            clock=clock,
            stuck_after=settings.stuck_after,
            alerters=alerters_for(
                settings.alert_webhook, allow_local=settings.alert_webhook_allow_local
            ),
        )
        self.maintenance = Maintenance(
            engine=engine,
            publisher=publisher,
            outbox_tables=[saga_outbox],
            clock=clock,
            relay_min_age=settings.relay_min_age,
            relay_batch=settings.relay_batch,
            sample_keep=settings.sample_keep,
            retention_days=settings.retention_days,
            purge_batch=settings.purge_batch,
            after_publish=lambda: self.hooks.relay(self.engine, clock),
        )
        counters = {
            p.queue: Counter(self._participant_engine_of(p.name), p.redelivery)
            for p in self.participants.values()
        }
        self.failures = FailurePolicy(
            counters=lambda queue: counters.get(queue) or Counter(engine, redelivery),
            publisher=publisher,
            holding=self.holding,
            retry_delays=settings.retry_delays,
            unknown_error_retries=settings.unknown_error_retries,
            poison_limit=settings.poison_limit,
            user=broker_user(settings.broker_url),
        )

    @property
    def engine(self) -> Engine:
        """This process's engine (a forked worker child gets its own; apps of one process
        on one database with the same settings share its pool)."""
        s = self.settings
        if not s.database_url:
            raise ConfigurationError(
                "SAGA_DATABASE_URL is empty: this process runs participants only, and what it "
                "was asked to do needs the orchestrator's database"
            )
        return get_engine(s.database_url, s.db_pool_size, prepare=s.db_prepare)

    def participant_engine(self, name: str) -> Engine:
        """This process's engine on participant ``name``'s database
        (``SAGA_PARTICIPANT_DATABASE_URL``; by default the orchestrator's)."""
        s = self.settings
        return get_engine(s.participant_database(name), s.db_pool_size, prepare=s.db_prepare)

    def _participant_engine_of(self, name: str) -> Callable[[], Engine]:
        return lambda: self.participant_engine(name)

    def table_engine(self, table: Table) -> Engine:
        """The engine of the database ``table`` lives in: a participant's tables in its
        own (its ledger, outbox and redelivery counts; another table by its schema, when
        one participant alone has it), the saga schema's in the orchestrator's."""
        owner = self._owners.get(id(table)) or self._schema_owners.get(table.schema or "")
        return self.engine if owner is None else self.participant_engine(owner)

    @property
    def publisher(self) -> Publisher:
        return Publisher(self.celery, self.topology, self.settings.publish_timeout)

    @property
    def outlet(self) -> Outlet:
        """Where this process sends committed outbox messages (a forked child gets its own)."""
        pid = os.getpid()
        found = self._outlets.get(pid)
        if found is not None:
            return found
        with self._lock:
            found = self._outlets.get(pid)
            if found is None:
                found = self._new_outlet()
                self._outlets = {pid: found}  # an inherited parent's outlet is unusable here
        return found

    def _new_outlet(self) -> Outlet:
        if self.settings.publish_mode == "sync":
            return SyncOutlet(self.table_engine, lambda: self.publisher)
        return Dispatcher(
            broker_url=self.settings.broker_url,
            encode=task_message_encoder(self.celery, self.topology),
            engine=self.table_engine,
            mark_interval=self.settings.mark_interval,
            connect_timeout=self.settings.publish_timeout,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message this process sent after a commit is confirmed by the
        broker and marked published (or left to recovery); False on timeout."""
        outlet = self._outlets.get(os.getpid())
        if outlet is None:
            return True
        return outlet.flush(self.settings.publish_timeout if timeout is None else timeout)

    def close(self) -> None:
        """Flush and close this process's outlet, and the Celery app's connections."""
        outlet = self._outlets.pop(os.getpid(), None)
        if outlet is not None:
            outlet.close(self.settings.publish_timeout)
        if "celery" in self.__dict__:
            self.celery.close()

    @cached_property
    def celery(self) -> Celery:
        """The Celery app: configured from the settings and topology, with every task."""
        celery = celery_app(self.name, self.settings, self.topology)
        register(
            celery,
            WorkerParts(
                settings=self.settings,
                topology=self.topology,
                orchestrator=self.orchestrator,
                sweeper=self.sweeper,
                intake=self.intake,
                alerts=self.alerts,
                maintenance=self.maintenance,
                holding=self.holding,
                failures=self.failures,
                runtimes=self.runtimes,
                engine=lambda: self.engine,
                flush=self.flush,
                timetable=self.timetable,
                gate=self.gate,
            ),
        )
        return celery

    def outbox_tables(self) -> list[Table]:
        """The orchestrator's outbox and every participant's (each in its own database:
        ``table_engine``)."""
        return [saga_outbox, *(p.outbox for p in self.participants.values())]

    def start_saga(
        self,
        saga_type: str,
        business_key: str,
        payload: Any,
        *,
        session: Session | None = None,
        traceparent: str | None = None,
    ) -> SagaHandle:
        """Start a saga (idempotent per type and business key); see ``Orchestrator.start``."""
        return self.orchestrator.start(
            saga_type, business_key, payload, session=session, traceparent=traceparent
        )

    def __repr__(self) -> str:
        return f"SagaApp({self.name!r}, sagas={sorted({d.saga_type for d in self.registry})})"


def _check_owners(sagas: Sequence[SagaDefinition], participants: Sequence[Participant]) -> None:
    """Each step's action and compensation belong to one participant, on the step's queue.

    Definitions built from task names cannot check this themselves; the app knows which
    participant handles which task.
    """
    owner = {h.task_name: p for p in participants for h in p.handlers.values()}
    handler = {h.task_name: h for p in participants for h in p.handlers.values()}
    for d in sagas:
        for s in d.steps:
            doer = owner.get(s.action)
            undoer = owner.get(s.compensation) if s.compensation else None
            compensation = handler.get(s.compensation or "")
            undoes = compensation.undoes if compensation is not None else None
            if undoer is not None and doer is undoer and s.action != f"{undoer.name}.{undoes}":
                raise CrossParticipantCompensation(
                    d.saga_type,
                    f"step {s.name!r}: its compensation {s.compensation} undoes "
                    f"{undoer.name}.{undoes}, not the step's {s.action}",
                )
            if doer is not None and undoer is not None and doer is not undoer:
                raise CrossParticipantCompensation(
                    d.saga_type,
                    f"step {s.name!r}: {s.action} belongs to {doer.name} but its compensation "
                    f"{s.compensation} to {undoer.name}; a compensation must be handled where "
                    "its forward command ran",
                )
            for task, p in ((s.action, doer), (s.compensation, undoer)):
                if p is not None and p.queue != s.queue:
                    raise CrossParticipantCompensation(
                        d.saga_type,
                        f"step {s.name!r} sends {task} to {s.queue}, but {p.name} "
                        f"consumes {p.queue}",
                    )
    _check_undoes(participants)


def _check_undoes(participants: Sequence[Participant]) -> None:
    """Each compensation undoes a command of its own participant. ``undoes=`` names the
    forward command in the ledger's tombstones and in the saga's checks above; misspelt,
    nothing would say so."""
    for p in participants:
        commands = sorted(a for a, h in p.handlers.items() if h.kind is MessageKind.COMMAND)
        for action, h in p.handlers.items():
            if h.kind is MessageKind.COMPENSATION and h.undoes not in commands:
                raise ConfigurationError(
                    f"{p.name}.{action} undoes {h.undoes!r}, which {p.name} does not define "
                    f"as a command (its commands: {', '.join(commands) or 'none'})"
                )


def _check_schedules(registry: Registry, schedules: Sequence[Schedule]) -> tuple[Schedule, ...]:
    """Each schedule names a loaded saga type and a payload it accepts (a fixed one is
    checked now, a function's at each tick); no two share a name, or a saga type and key
    (their ticks would start one saga between them)."""
    names: set[str] = set()
    keys: dict[tuple[str, str], str] = {}
    for s in schedules:
        if not isinstance(s, Schedule):
            raise ScheduleError(str(s), "is not a Schedule (build one with schedule())")
        if s.name in names:
            raise DuplicateSchedule(s.name, "two schedules have this name")
        names.add(s.name)
        other = keys.setdefault((s.saga_type, s.key), s.name)
        if other != s.name:
            raise DuplicateSchedule(
                s.name,
                f"starts {s.saga_type} sagas under the key {s.key!r}, as {other!r} does: give "
                "one a key of its own",
            )
        try:
            definition = registry.latest(s.saga_type)
        except UnknownSagaType as exc:
            raise UnknownScheduledSaga(s.name, str(exc)) from None
        if not callable(s.payload):
            try:
                definition.validate_payload(s.payload)
            except InvalidPayload as exc:
                raise InvalidScheduledPayload(s.name, str(exc)) from None
    return tuple(schedules)


NO_APP = (
    "no SagaApp named: set SAGA_TASKS_APP=module:attribute (or pass --app) to the module "
    "that builds your SagaApp"
)


def default_app() -> SagaApp:
    """The SagaApp that ``SAGA_TASKS_APP`` names (imported once, as any module is)."""
    spec = Settings.from_env().app
    if not spec:
        raise ConfigurationError(NO_APP)
    return load_app(spec)


def load_app(spec: str) -> SagaApp:
    """Import ``module:attribute`` and check it is a SagaApp."""
    if not spec:
        raise ConfigurationError(NO_APP)
    module_name, _, attribute = spec.partition(":")
    try:
        module = _import_from_cwd(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} (SAGA_TASKS_APP={spec}) from {Path.cwd()} or the "
            f"installed packages: {exc}; run from the directory that holds it, or install it"
        ) from exc
    candidate = getattr(module, attribute or "saga_app", None)
    if not isinstance(candidate, SagaApp):
        raise ConfigurationError(f"{spec} is not a SagaApp (set SAGA_TASKS_APP=module:attribute)")
    return candidate


def _import_from_cwd(module_name: str) -> Any:
    """Import ``module_name`` as ``celery -A`` does, the working directory first: so
    ``saga-tasks`` (a console script, whose path does not hold it) finds the module that
    ``celery -A`` finds from the same directory."""
    here = str(Path.cwd())
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)  # kept: the app's modules may import their siblings later
    return importlib.import_module(module_name)


def start_saga(
    saga_type: str,
    business_key: str,
    payload: Any,
    *,
    session: Session | None = None,
    traceparent: str | None = None,
) -> SagaHandle:
    """Start a saga on the app ``SAGA_TASKS_APP`` names; idempotent per (type, business key).

    With ``session``, the saga's rows are written in the caller's transaction and its
    first commands are published after that transaction commits; nothing is sent if
    it rolls back.
    """
    return default_app().start_saga(
        saga_type, business_key, payload, session=session, traceparent=traceparent
    )


__all__ = ["SagaApp", "default_app", "load_app", "start_saga"]
