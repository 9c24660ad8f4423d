"""The timeout sweeper: ``DeadlinePassed`` for every saga whose next deadline has passed.

Beat runs it (one beat at a time holds the lease); two sweeps at once never claim the
same saga (``FOR UPDATE SKIP LOCKED``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine

from saga_tasks.core.clock import Clock
from saga_tasks.core.decider import Decision, decide, hand_over
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.events import DeadlinePassed
from saga_tasks.core.messages import OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.core.registry import Registry
from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import UnknownDefinitionVersion
from saga_tasks.messaging.topology import Topology
from saga_tasks.observability import metrics
from saga_tasks.persistence import dispatch, sagas
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.runtime.flow import FlowControl
from saga_tasks.runtime.orchestrator import command_message, log_fields, observe
from saga_tasks.runtime.outlet import Outlet

log = logging.getLogger("saga_tasks.sweeper")


@dataclass
class SweepReport:
    """What one sweep did, for logs and tests."""

    claimed: int = 0
    changed: int = 0
    commands: int = 0
    errors: int = 0


class Sweeper:
    """Claims due sagas in batches and decides each at its deadline."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        registry: Registry,
        topology: Topology,
        outlet: Callable[[], Outlet],
        clock: Clock,
        backlog: Callable[[], Mapping[str, int]] | None = None,
        flow: FlowControl | None = None,
    ) -> None:
        self._engine = engine
        self.flow = flow or FlowControl({})
        """Releases commands waiting for capacity each sweep (the timer of rate limits,
        and a second chance for any release a transaction could not make)."""
        self.registry = registry
        self.topology = topology
        self._outlet = outlet
        self.clock = clock
        self._backlog = backlog
        """Messages waiting in each command queue (passive declares), read once per sweep
        that finds anything due: a step queued behind a backlog waits on."""

    @property
    def engine(self) -> Engine:
        return self._engine()

    def sweep(self, *, batch: int = 500, max_batches: int = 20) -> SweepReport:
        """Apply ``DeadlinePassed`` to every saga whose next deadline has passed.

        Each batch is one transaction of a fixed number of statements: claim due sagas
        (SKIP LOCKED), decide each in memory, write every changed saga, step, history
        line and command at once, commit, publish. Every claimed saga leaves the batch
        with a later wake-up time or none: a saga claimed with nothing due (its stored
        wake-up time disagrees with its state) gets the time repaired, and one that
        cannot be decided (its definition is not loaded, the decider raised, or a
        deadline passed that the decider does not act on) goes to MANUAL_REVIEW with
        the reason. Nothing claimed can come first in every batch and starve the rest.
        """
        report = SweepReport()
        backlog: Mapping[str, int] | None = None
        for _ in range(max_batches):
            now = self.clock.now()
            with translated(self.engine.url), self.engine.begin() as conn:
                due = sagas.claim_due(conn, now, batch)
                if due and backlog is None:
                    backlog = self._read_backlog()
                sent = dispatch.dispatch_times(conn, [s.saga_id for s in due])
                done = self._decide_due(due, now, report, backlog or {}, sent)
                messages = self._write_swept(conn, done, now)
                messages += self.flow.release(conn)
            report.claimed += len(due)
            report.changed += sum(1 for _, _, d in done if d.changed)
            report.commands += len(messages)
            for state, _, decision in done:
                if decision.changed:
                    observe(state, decision, None)
            self._outlet().send(saga_outbox, messages)
            if len(due) < batch:
                break
        return report

    def _read_backlog(self) -> Mapping[str, int]:
        """The command queues' backlog, or none known (then every silence is the
        participant's, as without this check) when the broker does not answer."""
        if self._backlog is None:
            return {}
        try:
            found = self._backlog()
        except Exception as exc:  # noqa: BLE001 - the sweep goes on without it
            log.warning("queue depths unknown this sweep (%s): resends as usual", exc)
            return {}
        waiting = ", ".join(f"{q} {n}" for q, n in found.items() if n)
        if waiting:
            log.info("command queues backed up (steps behind them wait on): %s", waiting)
        return found

    def _decide_due(
        self,
        due: Sequence[SagaState],
        now: datetime,
        report: SweepReport,
        backlog: Mapping[str, int],
        sent: Mapping[str, Mapping[str, datetime | None]],
    ) -> list[tuple[SagaState, SagaDefinition | None, Decision]]:
        done = []
        for state in due:
            definition: SagaDefinition | None = None
            try:
                definition = self.registry.get(state.saga_type, state.definition_version)
                event = DeadlinePassed(backlog, sent.get(state.saga_id, {}))
                decision = decide(definition, state, event, now)
            except UnknownDefinitionVersion as exc:
                decision = self._cannot_decide(state, str(exc), report, now)
            except Exception as exc:  # a bug must not stall every other saga's timeouts
                log.exception("the decider failed", extra={"saga_id": state.saga_id})
                decision = self._cannot_decide(
                    state, f"the decider failed at a deadline ({type(exc).__name__})", report, now
                )
            else:
                wake = decision.state.next_wake_at()
                if wake is not None and wake <= now:
                    decision = self._cannot_decide(
                        state,
                        f"a deadline passed ({wake.isoformat()}) and nothing was due for it",
                        report,
                        now,
                    )
            done.append((state, definition, decision))
        return done

    def _cannot_decide(
        self, state: SagaState, reason: str, report: SweepReport, now: datetime
    ) -> Decision:
        report.errors += 1
        metrics.SWEEP_HANDED_OVER.inc()
        log.error(
            "saga handed to a person: %s",
            reason,
            extra=log_fields(
                state, None, status_before=state.status, status_after=SagaStatus.MANUAL_REVIEW
            ),
        )
        return hand_over(state, reason, now=now)

    def _write_swept(
        self,
        conn: Connection,
        done: Sequence[tuple[SagaState, SagaDefinition | None, Decision]],
        now: datetime,
    ) -> list[OutboundMessage]:
        changes = sagas.Changes()
        for state, definition, decision in done:
            order = [s.name for s in definition.steps] if definition else list(state.steps)
            if decision.changed:
                changes.save(state, decision.state, order)
            else:
                changes.save(state, state, order, touch=False)  # repairs next_wake_at only
            changes.log(state.saga_id, decision.history, now)
            messages = [
                command_message(self.topology, decision.state, c, causation_id=None)
                for c in decision.commands
            ]
            self.flow.stage(
                conn,
                changes,
                definition=definition,
                old=state,
                new=decision.state,
                messages=messages,
            )
        sagas.write_changes(conn, changes, now)
        return changes.messages
