"""Branches, the pivot and human steps at their edges: each test pins a defect found by
trying to break them (a saga stranded, a signal refused that a client may retry, a
branch not taken sent anyway, a pivot that succeeded after compensation began)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from saga_tasks.core.conditions import equals
from saga_tasks.core.decider import hand_over, replay_awaits
from saga_tasks.core.decider.commands import fence_id
from saga_tasks.core.definitions import SagaDefinition, human_step, saga, step
from saga_tasks.core.events import DeadLettered, DeadlinePassed, OperatorAction, OperatorVerb
from saga_tasks.core.model import SagaState
from saga_tasks.core.states import Classification, MessageKind, Outcome, SagaStatus, StepStatus
from saga_tasks.errors import ActionRefused
from tests.unit.sagas import Driver, check


def act(d: Driver, verb: OperatorVerb, step_name: str | None = None, **kw: object):
    return d.apply(OperatorAction(verb, actor="ana", reason="ticket 14", step=step_name, **kw))


def returns() -> SagaDefinition:
    """The README's returns saga, in short."""
    return saga(
        "return",
        step("create", "r.create", compensation="r.cancel", queue="r.commands"),
        human_step("inspect", timeout=100, escalate_after=40),
        step(
            "refund",
            "p.refund",
            compensation="p.void",
            queue="p.commands",
            when=equals("inspect.decision", "accepted"),
            pivot=True,
        ),
        step("restock", "w.restock", queue="w.commands"),
        step("notify", "r.notify", queue="r.commands", timeout=10, retry=3),
        step(
            "send_back",
            "w.send_back",
            queue="w.commands",
            when=equals("inspect.decision", "rejected"),
            depends_on=["inspect"],
        ),
        step("close_rejected", "r.close", queue="r.commands"),
    )


def test_a_command_dead_lettered_after_the_pivot_can_be_replayed_beside_a_branch_not_taken():
    # After the refund (the pivot), restock's command is dead-lettered: the saga waits
    # for a person, who replays the held command. The rejected branch was not taken
    # (SKIPPED): that is no compensation, so the replayed command is awaited again.
    d = Driver(returns())
    d.start()
    d.succeed("create")
    d.signal("inspect", {"decision": "accepted"})
    d.succeed("refund")
    cid = d.state.steps["restock"].command_id
    d.apply(DeadLettered(MessageKind.COMMAND, "restock", cid, "m-dead", "rejected", 1))
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["send_back"].not_taken

    assert replay_awaits(d.state, "restock", MessageKind.COMMAND, cid) == "a given-up command"
    before = d.state
    decision = act(d, OperatorVerb.REPLAY, "restock", message_kind=MessageKind.COMMAND,
                   command_id=cid)  # fmt: skip
    check(d.definition, before, decision, operator=True)
    assert d.state.status is SagaStatus.RUNNING
    assert d.state.steps["restock"].status is StepStatus.REQUESTED


def test_the_same_decision_again_is_a_duplicate_after_the_saga_moved_on():
    # A client retries its signal (its first answer was lost); meanwhile the refund was
    # declined and the saga compensates: the decision is the one taken, not a refusal.
    d = Driver(returns())
    d.start()
    d.succeed("create")
    d.signal("inspect", {"decision": "accepted"})
    d.fail("refund")
    assert d.state.steps["inspect"].status is StepStatus.COMPENSATION_SKIPPED
    before = d.state
    again = d.signal("inspect", {"decision": "accepted"})
    assert again.classification is Classification.DUPLICATE
    assert not again.changed and again.state == before


def _pivot_beside() -> SagaDefinition:
    """r -> (pivot, s, s2, z): steps of other branches beside the pivot."""
    return saga(
        "beside",
        step("r", "p.r", compensation="p.ur", queue="q"),
        step("pv", "p.pv", compensation="p.upv", queue="q", depends_on=["r"], pivot=True),
        step("s", "p.s", compensation="p.us", queue="q", depends_on=["r"]),
        step("s2", "p.s2", compensation="p.us2", queue="q", depends_on=["r"]),
        step("z", "p.z", compensation="p.uz", queue="q", depends_on=["r"], timeout=5),
    )


def test_a_pivot_that_succeeds_once_compensation_began_is_compensated_like_any_step():
    # s fails while the pivot is in flight: the saga compensates. A compensation is
    # refused (review), and the pivot answers success then: the failure came first, so
    # the pivot is no point of no return. Nothing may go forward, and the saga must not
    # strand with a step waiting for a retry that no compensating saga sends.
    defn = _pivot_beside()
    d = Driver(defn)
    d.start()
    d.succeed("r")
    d.succeed("s2")
    d.fail("s")
    d.compensated("s2", Outcome.FAILURE)
    d.succeed("pv")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    before = d.state
    check(defn, before, act(d, OperatorVerb.RETRY_STEP, "s2"), operator=True)
    before = d.state
    decision = d.fail("z")
    check(defn, before, decision)
    assert not d.state.steps["z"].awaits_retry
    d.compensated("s2")
    assert d.state.steps["pv"].status is StepStatus.COMPENSATING
    d.compensated("pv")
    d.compensated("r")
    assert d.state.status is SagaStatus.COMPENSATED


def test_compensate_is_not_refused_for_a_pivot_that_succeeded_after_compensation_began():
    defn = _pivot_beside()
    d = Driver(defn)
    d.start()
    d.succeed("r")
    d.succeed("s2")
    d.fail("s")
    d.compensated("s2", Outcome.FAILURE)
    d.succeed("pv")
    before = d.state
    decision = act(d, OperatorVerb.COMPENSATE)
    check(defn, before, decision, operator=True)
    assert {(c.step, c.kind) for c in decision.commands} >= {("pv", MessageKind.COMPENSATION)}


def test_a_sweep_that_calls_a_reviewer_for_a_human_step_sends_no_retry_with_it():
    # After the pivot, step a failed (it awaits its retry) and the human step beside it
    # runs out of time in the same sweep: the saga goes to review, so the retry waits
    # for the person too rather than leaving for a saga that no longer goes forward.
    defn = saga(
        "both_due",
        step("pv", "p.pv", queue="q", pivot=True),
        step("a", "p.a", compensation="p.ua", queue="q", depends_on=["pv"], timeout=50, retry=3),
        human_step("h", timeout=50, depends_on=["pv"], on_timeout="manual_review"),
    )
    d = Driver(defn)
    d.start()
    d.succeed("pv")
    d.fail("a")
    assert d.state.steps["a"].awaits_retry
    before = d.state
    decision = d.tick(200)
    check(defn, before, decision)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert not decision.commands
    # The person takes the human step back; the retry follows at the next sweep.
    act(d, OperatorVerb.RETRY_STEP, "h")
    d.tick(1)
    assert d.state.steps["a"].status is StepStatus.REQUESTED


def test_a_sweep_that_a_spent_fence_sends_to_review_sends_no_retry_with_it():
    # After the pivot, b was done by hand (its command fenced, one attempt) and a failed
    # (it awaits its retry); both fall due in one sweep. The fence without an answer calls
    # a person: the retry must wait for them too, not go out with a saga in review.
    defn = saga(
        "both_due",
        step("pv", "p.pv", queue="q", pivot=True),
        step("a", "p.a", compensation="p.ua", queue="q", depends_on=["pv"], timeout=50, retry=3),
        step("b", "p.b", compensation="p.ub", queue="q", depends_on=["pv"], timeout=50,
             compensation_retry=1),
    )  # fmt: skip
    d = Driver(defn)
    d.start()
    d.succeed("pv")
    check(defn, d.state, act(d, OperatorVerb.SKIP_STEP, "b"), operator=True)
    assert d.state.steps["b"].fencing
    d.fail("a")
    assert d.state.steps["a"].awaits_retry
    before = d.state
    decision = d.tick(400)
    check(defn, before, decision)
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["b"].error == "fence_failed"
    assert not decision.commands
    assert d.state.steps["a"].awaits_retry, "the retry waits for the person"
    # The person replays the held fence: the saga resumes, and the retry follows.
    cid = fence_id(d.state, "b", d.state.steps["b"])
    before = d.state
    resumed = act(d, OperatorVerb.REPLAY, "b", message_kind=MessageKind.COMPENSATION,
                  command_id=cid)  # fmt: skip
    check(defn, before, resumed, operator=True)
    assert d.state.status is SagaStatus.RUNNING
    before = d.state
    decision = d.tick(1)
    check(defn, before, decision)
    assert [(c.step, c.kind) for c in decision.commands] == [("a", MessageKind.COMMAND)]


def test_an_operator_retry_of_a_ready_step_whose_condition_does_not_hold_sends_nothing():
    # The saga is in review (c's command was dead-lettered) when a answers, so b is
    # left PENDING with its parent settled; its condition does not hold. A retry of b
    # must not send a branch that is not taken: it is passed over, as dispatch would.
    defn = saga(
        "cond",
        step("a", "p.a", compensation="p.ua", queue="q"),
        step("b", "p.b", compensation="p.ub", queue="q", when=equals("payload.v", 1)),
        step(
            "c",
            "p.c",
            compensation="p.uc",
            queue="q",
            depends_on=[],
            on_dead_letter="manual_review",
        ),
    )
    d = Driver(defn, payload={"v": 2})
    d.start()
    cid = d.state.steps["c"].command_id
    d.apply(DeadLettered(MessageKind.COMMAND, "c", cid, "m-dead", "rejected", 1))
    d.succeed("a")
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    assert d.state.steps["b"].status is StepStatus.PENDING
    before = d.state
    decision = act(d, OperatorVerb.RETRY_STEP, "b")
    check(defn, before, decision, operator=True)
    assert ("b", MessageKind.COMMAND) not in {(c.step, c.kind) for c in decision.commands}
    assert d.state.steps["b"].not_taken


# -- random interleavings ------------------------------------------------------------------


def _beside_with_person() -> SagaDefinition:
    """A human step decides a branch; the pivot has a step of another branch beside it."""
    return saga(
        "mixed",
        step("r", "p.r", compensation="p.ur", queue="q", timeout=5, retry=2),
        human_step("h", timeout=30, escalate_after=10, on_timeout="manual_review"),
        step(
            "pv",
            "p.pv",
            compensation="p.upv",
            queue="q",
            pivot=True,
            when=equals("h.go", True),
            timeout=5,
            retry=2,
            late_reply="manual_review",
        ),
        step("x", "p.x", compensation="p.ux", queue="q", depends_on=["h"], timeout=5, retry=2),
        step("a", "p.a", compensation="p.ua", queue="q", depends_on=["pv"], timeout=5, retry=2),
        human_step("h2", timeout=20, depends_on=["pv"], on_timeout="manual_review"),
        step("n", "p.n", queue="q", depends_on=["a", "h2"], timeout=5, retry=2),
        step("no", "p.no", queue="q", depends_on=["h"], when=~equals("h.go", True), timeout=5),
    )


DEFINITIONS = {"returns": returns(), "mixed": _beside_with_person()}
VERBS = [OperatorVerb.RETRY_STEP, OperatorVerb.SKIP_STEP, OperatorVerb.COMPENSATE,
         OperatorVerb.RESOLVE, OperatorVerb.REPLAY]  # fmt: skip


def _event(d: Driver, data: st.DataObject):
    """One event the world could send now, or None when it has nothing to say."""
    steps = d.state.steps
    defn = d.definition
    kind = data.draw(
        st.sampled_from(["reply", "reply", "reply", "lapse", "signal", "dead", "operator"])
    )
    if kind == "reply":
        out = [n for n, x in steps.items() if x.in_flight and defn.step(n).human is None] + [
            n for n, x in steps.items() if x.command_id and defn.step(n).human is None
        ]
        if not out:
            return None
        name = data.draw(st.sampled_from(out))
        x = steps[name]
        comp = x.status is not StepStatus.REQUESTED and x.compensation_id is not None
        comp = comp and data.draw(st.booleans())
        outcome = data.draw(st.sampled_from([Outcome.SUCCESS, Outcome.SUCCESS, Outcome.FAILURE]))
        return d.reply(
            name,
            outcome,
            kind=MessageKind.COMPENSATION if comp else MessageKind.COMMAND,
            result={"go": data.draw(st.booleans())} if outcome is Outcome.SUCCESS else None,
        )
    if kind == "lapse":
        return "lapse" if d.state.next_wake_at() is not None else None
    if kind == "signal":
        humans = [s.name for s in defn.steps if s.human is not None]
        name = data.draw(st.sampled_from(humans))
        return SignalReceived_(name, {"go": data.draw(st.booleans()),
                                      "decision": data.draw(st.sampled_from(["accepted", "rejected"]))})  # fmt: skip
    if kind == "dead":
        sent = [n for n, x in steps.items() if x.command_id]
        if not sent:
            return None
        name = data.draw(st.sampled_from(sent))
        x = steps[name]
        mk = data.draw(st.sampled_from([MessageKind.COMMAND, MessageKind.COMPENSATION]))
        cid = x.command_id if mk is MessageKind.COMMAND else x.compensation_id
        return DeadLettered(mk, name, cid, f"dead-{d.state.version}", "rejected", 1)
    verb = data.draw(st.sampled_from(VERBS))
    name = data.draw(st.sampled_from(list(defn.by_name)))
    x = steps[name]
    return OperatorAction(
        verb,
        actor="ana",
        reason="property",
        step=name,
        resolution=data.draw(st.sampled_from(["COMPLETED", "COMPENSATED", "FAILED"])),
        message_kind=data.draw(st.sampled_from([MessageKind.COMMAND, MessageKind.COMPENSATION])),
        command_id=data.draw(st.sampled_from([x.command_id, x.compensation_id])),
    )


def _forward(d: Driver, data: st.DataObject):
    """What moves the saga towards its pivot: a success, a signal that takes it, time."""
    for n, x in d.state.steps.items():
        if x.status is StepStatus.REQUESTED:
            if d.definition.step(n).human is not None:
                return SignalReceived_(n, {"go": True, "decision": "accepted"})
            return d.reply(n, result={"go": True})
    return "lapse" if d.state.next_wake_at() is not None else None


class SignalReceived_:
    """A marker: the Driver builds the signal."""

    def __init__(self, step: str, data: dict[str, object]) -> None:
        self.step, self.data = step, data


def _pivot_passed(defn: SagaDefinition, state: SagaState) -> bool:
    pivot = defn.pivot
    begun = state.status is SagaStatus.COMPENSATING or any(
        x.status
        in (
            StepStatus.COMPENSATING,
            StepStatus.COMPENSATED,
            StepStatus.COMPENSATION_FAILED,
            StepStatus.COMPENSATION_SKIPPED,
            StepStatus.SKIPPED,
        )
        and not x.not_taken
        for x in state.steps.values()
    )
    return pivot is not None and state.steps[pivot].status is StepStatus.SUCCEEDED and not begun


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_interleavings_keep_every_rule(name: str, data: st.DataObject) -> None:
    defn = DEFINITIONS[name]
    # A fixed id: the jitter of retries derives from it, and hypothesis replays runs.
    d = Driver(defn, saga_id="5a6a0000-0000-4000-8000-000000000014", payload={"v": 1})
    d.start()
    gentle = data.draw(st.booleans())  # straight to the pivot, then anything
    for _ in range(40):
        if d.state.status not in (SagaStatus.RUNNING, SagaStatus.COMPENSATING,
                                  SagaStatus.MANUAL_REVIEW):  # fmt: skip
            break
        if gentle and not _pivot_passed(defn, d.state) and d.state.status is SagaStatus.RUNNING:
            ev = _forward(d, data)
        else:
            ev = _event(d, data)
        if ev is None:
            continue
        before = d.state
        passed = _pivot_passed(defn, before)
        operator = isinstance(ev, OperatorAction)
        try:
            if ev == "lapse":
                wake = before.next_wake_at()
                assert wake is not None
                seconds = max((wake - d.now).total_seconds(), 0) + 0.5
                decision = d.apply(DeadlinePassed({}, {}), step=seconds)
                swept = True
            elif isinstance(ev, SignalReceived_):
                decision = d.signal(ev.step, ev.data)
                swept = False
            else:
                decision = d.apply(ev)
                swept = False
        except ActionRefused:
            continue
        check(defn, before, decision, operator=operator)
        after = decision.state
        if swept:
            wake = after.next_wake_at()
            # The sweeper hands a saga still due after its decision to a person.
            assert wake is None or wake > d.now, (wake, d.now, after)
        if passed:
            fences = {h.step for h in decision.history if h.event.startswith("fence_")}
            for c in decision.commands:
                assert c.kind is not MessageKind.COMPENSATION or c.step in fences, (
                    "nothing is compensated once the pivot succeeded",
                    c.step,
                    [h.event for h in decision.history],
                )
        for n, x in after.steps.items():
            if x.not_taken:
                assert before.steps[n].not_taken or before.steps[n].status is StepStatus.PENDING
    event(f"ended {d.state.status.value}; pivot passed {_pivot_passed(defn, d.state)}")


def test_a_human_step_cannot_be_skipped_its_decision_would_be_missing() -> None:
    d = Driver(returns())
    d.start()
    for name, x in d.state.steps.items():
        if x.status is StepStatus.REQUESTED:
            d.succeed(name)
    assert d.state.steps["inspect"].status is StepStatus.REQUESTED
    with pytest.raises(ActionRefused, match="signal"):
        act(d, OperatorVerb.SKIP_STEP, "inspect")


def _branch_on_a_step() -> SagaDefinition:
    """An ordinary step's result chooses the branch: inspect -> (refund | send_back)."""
    return saga(
        "branch_on_step",
        step("inspect", "w.inspect", compensation="w.uninspect", queue="w.commands",
             on_dead_letter="manual_review"),
        step("refund", "p.refund", compensation="p.void", queue="p.commands",
             when=equals("inspect.decision", "accepted")),
        step("send_back", "w.send_back", compensation="w.recall", queue="w.commands",
             when=equals("inspect.decision", "rejected"), depends_on=["inspect"]),
    )  # fmt: skip


@pytest.mark.parametrize("in_review", [False, True])
def test_a_step_a_condition_reads_cannot_be_done_by_hand(in_review: bool) -> None:
    # Done by hand, inspect's result would be {"skipped_by": ...}: both conditions read
    # null, neither branch is taken, and the return completes neither refunded nor sent
    # back. Refused, saying what to do instead; nothing is written.
    defn = _branch_on_a_step()
    d = Driver(defn)
    d.start()
    if in_review:  # its command was dead-lettered: a person is to decide what next
        cid = d.state.steps["inspect"].command_id
        d.apply(DeadLettered(MessageKind.COMMAND, "inspect", cid, "m-dead", "rejected", 1))
        assert d.state.status is SagaStatus.MANUAL_REVIEW
    before = d.state
    with pytest.raises(ActionRefused, match=r"condition of step 'refund'.*retry it"):
        act(d, OperatorVerb.SKIP_STEP, "inspect")
    assert d.state == before
    # The answer it waits for decides the branch, as it should.
    if not in_review:
        d.apply(d.reply("inspect", result={"decision": "rejected"}))
        assert d.state.steps["refund"].not_taken
        assert d.state.steps["send_back"].status is StepStatus.REQUESTED


def test_a_step_no_pending_condition_reads_can_still_be_done_by_hand() -> None:
    defn = _branch_on_a_step()
    d = Driver(defn)
    d.start()
    d.apply(d.reply("inspect", result={"decision": "accepted"}))
    before = d.state
    decision = act(d, OperatorVerb.SKIP_STEP, "refund")
    check(defn, before, decision, operator=True)
    fence = next(c for c in decision.commands if c.kind is MessageKind.COMPENSATION)
    d.apply(d.reply("refund", kind=MessageKind.COMPENSATION, command_id=fence.command_id))
    assert d.state.status is SagaStatus.COMPLETED


def _person_beside_a_step() -> SagaDefinition:
    """A person decides h while c runs beside it; c's dead letter calls a reviewer."""
    return saga(
        "beside_person",
        step("c", "p.c", compensation="p.uc", queue="q", depends_on=[], timeout=1000,
             on_dead_letter="manual_review"),
        human_step("h", timeout=100, escalate_after=40, depends_on=[]),
        step("after", "p.after", compensation="p.uafter", queue="q", depends_on=["c", "h"]),
        timeout=100_000,
    )  # fmt: skip


def test_time_in_review_does_not_count_against_a_person():
    # h waits 30 s, then c's command is dead-lettered and the saga waits 500 s in review,
    # where no decision can be given. Resumed, h still has 70 s: the next sweep neither
    # escalates nor fails it (before: it failed at once with no_signal and compensated).
    defn = _person_beside_a_step()
    d = Driver(defn)
    d.start()
    wake, asked = d.state.steps["h"].deadline, d.state.steps["h"].requested_at
    assert wake is not None and asked is not None
    d.now += timedelta(seconds=30)
    cid = d.state.steps["c"].command_id
    d.apply(DeadLettered(MessageKind.COMMAND, "c", cid, "m-dead", "rejected", 1))
    assert d.state.status is SagaStatus.MANUAL_REVIEW
    stopped = d.now
    with pytest.raises(ActionRefused):
        d.signal("h", {"ok": True})
    d.now += timedelta(seconds=500)
    before = d.state
    resumed = act(d, OperatorVerb.REPLAY, "c", message_kind=MessageKind.COMMAND, command_id=cid)
    check(defn, before, resumed, operator=True)
    assert d.state.status is SagaStatus.RUNNING
    resumed_at, h = d.now, d.state.steps["h"]
    before = d.state
    decision = d.tick(1)
    check(defn, before, decision)
    assert d.state.status is SagaStatus.RUNNING
    assert d.state.steps["h"].status is StepStatus.REQUESTED
    assert d.state.steps["h"].error is None, "not escalated: 31 s of 40 have passed"
    assert h.deadline == wake + (resumed_at - stopped), "moved on by the time in review"
    assert h.requested_at == asked and h.finished_at is None
    # Escalated at 40 s of waiting outside review, failed at 100 s.
    d.lapse()
    assert d.state.steps["h"].error == "escalated"
    assert d.state.steps["h"].deadline == h.deadline + timedelta(seconds=60)
    d.signal("h", {"ok": True})
    assert d.state.steps["h"].status is StepStatus.SUCCEEDED


def test_a_saga_the_sweeper_hands_over_stops_a_persons_wait_too():
    defn = _person_beside_a_step()
    d = Driver(defn)
    d.start()
    d.now += timedelta(seconds=10)
    decision = hand_over(d.state, "the decider failed at a deadline (KeyError)", now=d.now)
    assert decision.state.steps["h"].finished_at == d.now
    assert [h.event for h in decision.history] == ["manual_review", "signal_wait_stopped"]
    d.state = decision.state
    d.now += timedelta(seconds=300)
    act(d, OperatorVerb.RETRY_STEP, "c")  # the same command again: the saga resumes
    assert d.state.steps["h"].deadline == d.state.steps["h"].requested_at + timedelta(
        seconds=40 + 300 + 0.01
    )
