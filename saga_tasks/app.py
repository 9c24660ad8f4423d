"""``SagaApp``: saga definitions, participants and settings, and the Celery app that runs them.

Built from explicit lists; importing a module registers nothing. One SagaApp serves
every process of a deployment (orchestrator, participant workers, beat, CLI, web):
each worker picks its queue with ``-Q``.

    saga_app = SagaApp(sagas=[ORDER_SAGA], participants=[orders, inventory, payments])
    app = saga_app.celery        # celery -A yourmodule worker -Q saga.replies
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from saga_tasks.config import Settings
from saga_tasks.core.clock import Clock, SystemClock
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.registry import Registry
from saga_tasks.errors import ConfigurationError, CrossParticipantCompensation
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.messaging.topology import Topology
from saga_tasks.participant import Participant
from saga_tasks.persistence.db import get_engine
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.runtime.orchestrator import Orchestrator, SagaHandle
from saga_tasks.runtime.outlet import Outlet, SyncOutlet
from saga_tasks.runtime.participant import ParticipantRuntime
from saga_tasks.runtime.sweeper import Sweeper

_default: list[SagaApp] = []
"""The first SagaApp built in this process, which ``start_saga`` uses."""
_default_lock = threading.Lock()


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
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.clock = clock or SystemClock()
        from saga_tasks.observability import tracing

        tracing.configure(self.settings.trace_export)
        from saga_tasks.persistence import prepared

        prepared.enable(self.settings.db_prepare)
        self.registry = Registry(sagas)
        self.participants = {p.name: p for p in participants}
        if len(self.participants) != len(participants):
            raise ConfigurationError("two participants share a name")
        _check_owners(sagas, participants)
        queues = {p.queue for p in participants} | {q for d in sagas for q in d.queues}
        self.topology = Topology(
            command_queues=tuple(sorted(queues)),
            queue_type=self.settings.queue_type,
            retry_tiers=self.settings.retry_delays,
        )
        self.name = name
        self.orchestrator = Orchestrator(
            engine=lambda: self.engine,
            registry=self.registry,
            topology=self.topology,
            outlet=lambda: self.outlet,
            clock=self.clock,
            demo_faults=self.settings.demo_faults,
        )
        self.sweeper = Sweeper(
            engine=lambda: self.engine,
            registry=self.registry,
            topology=self.topology,
            outlet=lambda: self.outlet,
            clock=self.clock,
        )
        self.runtimes = {
            p.name: ParticipantRuntime(
                p,
                engine=lambda: self.engine,
                publisher=lambda: self.publisher,
                outlet=lambda: self.outlet,
                clock=self.clock,
                demo_faults=self.settings.demo_faults,
            )
            for p in participants
        }
        self._outlets: dict[int, Outlet] = {}
        self._outlet_lock = threading.Lock()
        with _default_lock:
            if not _default:
                _default.append(self)

    @property
    def engine(self) -> Engine:
        """This process's engine (a forked worker child gets its own)."""
        return get_engine(self.settings.database_url, self.settings.db_pool_size)

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
        with self._outlet_lock:
            found = self._outlets.get(pid)
            if found is None:
                found = self._new_outlet()
                self._outlets = {pid: found}  # an inherited parent's outlet is unusable here
        return found

    def _new_outlet(self) -> Outlet:
        if self.settings.publish_mode == "sync":
            return SyncOutlet(lambda: self.engine, lambda: self.publisher)
        from saga_tasks.messaging.dispatcher import Dispatcher
        from saga_tasks.messaging.publisher import task_message_encoder

        return Dispatcher(
            broker_url=self.settings.broker_url,
            encode=task_message_encoder(self.celery, self.topology),
            engine=lambda: self.engine,
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
        from saga_tasks.worker.tasks import build_celery

        return build_celery(self)

    def outbox_tables(self) -> list[Any]:
        """The orchestrator's outbox and every participant's: what recovery scans."""
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
    for d in sagas:
        for s in d.steps:
            doer = owner.get(s.action)
            undoer = owner.get(s.compensation) if s.compensation else None
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


def default_app() -> SagaApp:
    """The first SagaApp built in this process, else the one ``SAGA_TASKS_APP`` names."""
    if _default:
        return _default[0]
    return load_app(Settings.from_env().app)


def load_app(spec: str) -> SagaApp:
    """Import ``module:attribute`` and check it is a SagaApp."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} (SAGA_TASKS_APP={spec}): {exc}"
        ) from exc
    candidate = getattr(module, attribute or "saga_app", None)
    if not isinstance(candidate, SagaApp):
        raise ConfigurationError(f"{spec} is not a SagaApp (set SAGA_TASKS_APP=module:attribute)")
    return candidate


def start_saga(
    saga_type: str,
    business_key: str,
    payload: Any,
    *,
    session: Session | None = None,
    traceparent: str | None = None,
) -> SagaHandle:
    """Start a saga on the default app; idempotent per (saga type, business key).

    With ``session``, the saga's rows are written in the caller's transaction and its
    first commands are published after that transaction commits; nothing is sent if
    it rolls back.
    """
    return default_app().start_saga(
        saga_type, business_key, payload, session=session, traceparent=traceparent
    )


__all__ = ["SagaApp", "default_app", "load_app", "start_saga"]
