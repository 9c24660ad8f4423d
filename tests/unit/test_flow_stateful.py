"""The stateful world of ``test_decider_stateful`` with flow control in it: each decision's
commands pass through ``core.capacity`` (what waits, which places are given back) into a
model of ``saga_dispatch`` (``flow_model``), commands reach the network only when sent or
released, the sweeper sees when each left and releases what fits, a replay takes its
step's place, and deploys change the limit at any moment: between the decision that
holds a command and the answer that frees its place, too.

On top of the world's own invariants: a place is held only by a step that awaits its
command, and by one command at most; an ended saga leaves nothing waiting and no place
held; and a step awaiting a command that went out while its queue had a limit holds a
place (or waits for one), so the count cannot fall short of what is out either.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from saga_tasks.core import capacity
from saga_tasks.core.decider import CommandIntent
from saga_tasks.core.events import DeadlinePassed
from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.core.states import ACTIVE_SAGA, TERMINAL_SAGA
from tests.unit.flow_model import DispatchTable
from tests.unit.sagas import check
from tests.unit.test_decider_stateful import IN_CI, SagaWorld, timed_definitions

QUEUE = "p.commands"
"""The one queue of the world's steps."""


class FlowSagaWorld(SagaWorld):
    """One saga, its participants, the network, and flow control at their queue.

    On the decider's richest definitions (branches, people, the pivot). It found that a
    late answer reopening an ended saga (an operator resolved it while a command was
    out) left that command uncounted: its place, given back at the end, is taken again
    now (``capacity.Staged.retaken``)."""

    definitions = timed_definitions()

    @initialize(data=st.data(), limit=st.sampled_from([0, 1, 2]))
    def begin(self, data: st.DataObject, limit: int = 1) -> None:
        self.limit = limit
        """``SAGA_MAX_IN_FLIGHT`` of the deployment now running; 0: flow control off."""
        self.table = DispatchTable()
        self.intents: dict[str, CommandIntent] = {}  # message id -> the command it carries
        self.under_limit: dict[str, bool] = {}  # step -> its latest command left under a limit
        super().begin(data)  # draws the definition from SagaWorld.definitions

    @property
    def limited(self) -> set[str]:
        return {QUEUE} if self.limit else set()

    def _message(self, command: CommandIntent) -> OutboundMessage:
        self.intents[command.message_id] = command
        return OutboundMessage(
            message_id=command.message_id,
            task_name=command.task_name,
            queue=command.queue,
            headers={H_STEP: command.step},
            body={},
            saga_id=command.saga_id,
        )

    def _send(self, messages: tuple[OutboundMessage, ...] | list[OutboundMessage]) -> None:
        """Published after the commit: on the network now."""
        for m in messages:
            command = self.intents[m.message_id]
            self.commands.append(command)
            self.under_limit[command.step] = bool(self.limit)

    def _decide(self, before, decision, *, operator: bool = False) -> None:
        """``Orchestrator._write_decision``: stage, write, release the queues touched."""
        check(self.defn, before, decision, operator=operator)
        messages = [self._message(c) for c in decision.commands]
        again = capacity.held_again(self.limited, before, messages)
        staged = capacity.stage(
            self.limited,
            self.defn,
            old=before,
            new=decision.state,
            messages=messages,
            out=self.table.out(again),
        )
        self.table.write(staged, decision.state.status, self.driver.now)
        self._send(staged.sent)
        if staged.touched & self.limited:
            self._send(self.table.release(self.limit, self.driver.now))

    def _deadline_passed(self, backlog: int) -> DeadlinePassed:
        return DeadlinePassed({QUEUE: backlog}, self.table.dispatch_times())

    def _swept(self) -> None:
        """Every sweep releases what fits (all that waits, at a queue without a limit)."""
        self._send(self.table.release(self.limit, self.driver.now))

    def _replayed(self, command: CommandIntent) -> None:
        """``Replayer._take_place``: the replay went out by hand, not through the outbox."""
        state = self.driver.state
        if capacity.takes_place(self.limited, command.queue, state, command.step):
            self.table.take_place(self._message(command), self.driver.now)
        self.under_limit[command.step] = bool(self.limit)

    @rule(limit=st.sampled_from([0, 1, 2]))
    def a_deploy_changes_the_limit(self, limit: int) -> None:
        """A redeploy with another ``SAGA_MAX_IN_FLIGHT``; nothing runs until the next
        message or sweep, as in a real deploy."""
        self.limit = limit

    # -- what must always hold -------------------------------------------------------------

    @invariant()
    def a_place_is_held_only_by_a_step_that_awaits_it(self) -> None:
        if not hasattr(self, "table"):
            return
        state = self.driver.state
        counted = [r.step for r in self.table.rows if r.counted]
        for step in counted:
            assert state.status in ACTIVE_SAGA and state.steps[step].in_flight, (
                f"{step} ({state.steps[step].status.value}, saga {state.status.value}) still "
                "holds a place at its queue"
            )
        assert len(counted) == len(set(counted)), f"a step holds two places: {counted}"

    @invariant()
    def an_ended_saga_leaves_nothing_waiting_nor_placed(self) -> None:
        if not hasattr(self, "table") or self.driver.state.status not in TERMINAL_SAGA:
            return
        left = [(r.step, r.sent_at) for r in self.table.rows if r.waiting or r.sent_at]
        assert not left, f"the saga ended ({self.driver.state.status.value}), yet: {left}"

    @invariant()
    def what_went_out_under_a_limit_holds_a_place(self) -> None:
        if not hasattr(self, "table") or self.driver.state.status in TERMINAL_SAGA:
            return
        live = {r.step for r in self.table.rows if not r.withdrawn}
        for name, st_ in self.driver.state.steps.items():
            if st_.in_flight and self.under_limit.get(name):
                assert name in live, f"{name} awaits a command sent under a limit, uncounted"


pytestmark = pytest.mark.timeout(300)

FlowSagaWorld.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestFlowSagaWorld = FlowSagaWorld.TestCase


class StrictFlowSagaWorld(FlowSagaWorld):
    """The same, held to what the shell and the participants rely on (``StrictSagaWorld``)."""

    strict = True


StrictFlowSagaWorld.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=IN_CI,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestStrictFlowSagaWorld = StrictFlowSagaWorld.TestCase
