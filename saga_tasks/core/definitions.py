"""Saga definitions as frozen, validated data, built with two small functions.

    order = saga(
        "order",
        step("create_order", "orders.create", compensation="orders.cancel",
             queue="orders.commands"),
        step("reserve_stock", "inventory.reserve", compensation="inventory.release",
             queue="inventory.commands"),
        version=1, timeout=600, payload=OrderPayload,
    )

Steps form a DAG through ``depends_on``. Left out, a step depends on the step listed
before it, so a plain list is the linear case; ``depends_on=()`` makes a root. Every
problem (duplicate step, unknown dependency, cycle, missing queue) is a typed
``DefinitionError`` raised here, when the definition is built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from saga_tasks.core.conditions import PAYLOAD, Condition
from saga_tasks.core.documents import NotJson, json_document
from saga_tasks.errors import (
    CrossParticipantCompensation,
    DefinitionError,
    DependencyCycle,
    DuplicateStep,
    InvalidPayload,
    MissingQueue,
    UnknownDependency,
)

__all__ = [
    "DeadLetterPolicy",
    "HumanTask",
    "HumanTimeoutPolicy",
    "LateReplyPolicy",
    "RetryPolicy",
    "SagaDefinition",
    "SignalField",
    "Step",
    "human_step",
    "saga",
    "step",
]


class LateReplyPolicy(StrEnum):
    """What to do with a reply that arrives after its step was given up."""

    COMPENSATE = "compensate"
    """A late success is undone at once; a late failure only needs an audit entry."""
    IGNORE = "ignore"
    """Recorded in the history, nothing else."""
    MANUAL_REVIEW = "manual_review"
    """The saga waits for a person."""


class DeadLetterPolicy(StrEnum):
    """What a step's command reaching the dead-letter queue does to its saga."""

    COMPENSATE = "compensate"
    """Give the step up (its compensation leaves a tombstone or undoes it) and compensate."""
    MANUAL_REVIEW = "manual_review"
    """The saga waits for a person."""


class HumanTimeoutPolicy(StrEnum):
    """What a human step's deadline passing with no decision does."""

    COMPENSATE = "compensate"
    """The step fails (``no_signal``) and the saga compensates what it did."""
    MANUAL_REVIEW = "manual_review"
    """The step is given up and the saga waits for an operator (retry re-opens the wait)."""


@dataclass(frozen=True)
class SignalField:
    """One field a human step's schema asks for, as a form lists it."""

    name: str
    takes: str
    """Its type (``string``, ``integer``, ...) or the values it allows, as JSON
    (``"accepted" | "rejected"``)."""
    required: bool


@dataclass(frozen=True)
class HumanTask:
    """What makes a step wait for a person's signal instead of a participant's reply."""

    schema: Callable[[Any], Mapping[str, Any]] | None = None
    """Validates the signal's data (a pydantic model's ``model_validate`` or a callable);
    None takes any JSON object."""
    schema_name: str | None = None
    """The schema's name, for ``describe``."""
    fields: tuple[SignalField, ...] = ()
    """The fields of a pydantic model schema, read when the step is defined (a plain
    callable tells none): ``schema`` is a closure by then, which tells nothing."""
    escalate_after: timedelta | None = None
    """When, after the wait began, an alert says the decision is still missing."""
    on_timeout: HumanTimeoutPolicy = HumanTimeoutPolicy.COMPENSATE

    def validate(self, data: Any) -> dict[str, Any]:
        """The signal's data as stored (a JSON document: a repeated decision is compared
        with what was stored), or ``InvalidPayload`` naming each problem."""
        if self.schema is None:
            if not isinstance(data, Mapping):
                raise InvalidPayload("signal data must be a JSON object")
            return _stored("signal data", data, "the data")
        try:
            valid = self.schema(data)
        except InvalidPayload:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidPayload(f"signal data: {_describe_validation(exc)}") from exc
        return _stored("signal data", valid, f"the step's schema ({self.schema_name})")


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how far apart, the orchestrator sends the same command.

    Re-sends keep the command id, so an idempotent participant runs the work once. The
    first attempt waits the step's timeout; each later one waits ``backoff`` times longer
    than the one before, up to ``max_interval``, less a share of up to ``jitter`` (the
    same for a given command and attempt, so the decider stays deterministic) so that
    sagas silenced together are not all sent again together.
    """

    max_attempts: int = 3
    """Sends of one command before the step is given up; at least 1. A step that cannot
    be undone, and a compensation, are not given up: they are sent again, at most
    ``max_interval`` apart, until they answer, with an alert once these are spent."""
    backoff: float = 2.0
    """How much longer each attempt waits than the one before; at least 1."""
    max_interval: timedelta | None = None
    """The longest wait of one attempt; None: ten times the step's timeout."""
    jitter: float = 0.25
    """The largest share taken off an attempt's wait at random; 0 to below 1."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be at least 1")
        if self.backoff < 1:
            raise ValueError("RetryPolicy.backoff must be at least 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("RetryPolicy.jitter must be at least 0 and below 1")
        if self.max_interval is not None and self.max_interval <= timedelta(0):
            raise ValueError("RetryPolicy.max_interval must be positive")

    def wait(self, timeout: timedelta, attempt: int, key: str) -> timedelta:
        """How long attempt ``attempt`` (1 the first) of a step with ``timeout`` waits
        for its answer; ``key`` names the command, whose jitter it fixes."""
        if attempt <= 1:
            return timeout
        base = timeout.total_seconds()
        cap = max((self.max_interval or timeout * 10).total_seconds(), base)
        grown = min(base * self.backoff ** min(attempt - 1, 64), cap)
        digest = hashlib.blake2b(f"{key}:{attempt}".encode(), digest_size=8).digest()
        share = int.from_bytes(digest, "big") / 2**64
        return timedelta(seconds=max(base, grown * (1 - self.jitter * share)))


@runtime_checkable
class CommandTarget(Protocol):
    """Anything that names a task and its queue, such as a participant's handler."""

    @property
    def task_name(self) -> str: ...

    @property
    def queue(self) -> str: ...


_PREVIOUS: tuple[str, ...] = ("\0previous",)


@dataclass(frozen=True)
class Step:
    """One local transaction of a saga and the command that undoes it."""

    name: str
    """Unique within the saga; appears in history, headers and the CLI."""
    action: str
    """Celery task name of the forward command, e.g. ``inventory.reserve``."""
    queue: str
    """Queue the participant's worker consumes, e.g. ``inventory.commands``."""
    compensation: str | None = None
    """Task that undoes the action, on the same queue; None for a step that cannot be undone."""
    timeout: timedelta = timedelta(seconds=30)
    """How long one attempt may wait for its reply."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Sends of the forward command before the step is given up (a step without a
    compensation is not: it is sent again until it answers), and how far apart."""
    compensation_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_attempts=5))
    """Sends of the compensation before an alert; it is sent again until it answers."""
    late_reply: LateReplyPolicy = LateReplyPolicy.COMPENSATE
    """What a reply that comes after the step was given up does."""
    on_dead_letter: DeadLetterPolicy = DeadLetterPolicy.COMPENSATE
    """What the step's command reaching the dead-letter queue does."""
    depends_on: tuple[str, ...] = _PREVIOUS
    """Steps that must have succeeded before this one is sent."""
    named_queues: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """Every queue the step's arguments named (``queue=``, the action's, the
    compensation's): more than one means two participants, which is refused."""
    when: Condition | None = None
    """The step runs only when this holds (evaluated once its parents are settled);
    otherwise it is ``SKIPPED``: never sent, never awaited, never compensated."""
    pivot: bool = False
    """The point of no return: once it succeeded the saga only goes forward; later
    steps are retried, never compensated."""
    human: HumanTask | None = None
    """Set for a step that waits for a person's signal; it has no action nor queue."""

    @property
    def compensable(self) -> bool:
        return self.compensation is not None


def step(
    name: str,
    action: str | CommandTarget,
    *,
    compensation: str | CommandTarget | None = None,
    queue: str | None = None,
    timeout: float | timedelta = 30.0,
    retry: RetryPolicy | int | None = None,
    compensation_retry: RetryPolicy | int | None = None,
    late_reply: LateReplyPolicy | str = LateReplyPolicy.COMPENSATE,
    on_dead_letter: DeadLetterPolicy | str = DeadLetterPolicy.COMPENSATE,
    depends_on: Iterable[str] | None = None,
    when: Condition | None = None,
    pivot: bool = False,
) -> Step:
    """Build a step; ``action`` is a task name or a participant handler (which knows its queue)."""
    action_name, action_queue = _target(action)
    comp_name, comp_queue = _target(compensation) if compensation is not None else (None, None)
    chosen_queue = queue or action_queue or comp_queue or ""
    return Step(
        name=name,
        action=action_name,
        queue=chosen_queue,
        compensation=comp_name,
        timeout=timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout),
        retry=_policy(retry, RetryPolicy()),
        compensation_retry=_policy(compensation_retry, RetryPolicy(max_attempts=5)),
        late_reply=LateReplyPolicy(late_reply),
        on_dead_letter=DeadLetterPolicy(on_dead_letter),
        depends_on=_PREVIOUS if depends_on is None else tuple(depends_on),
        named_queues=tuple(sorted({q for q in (queue, action_queue, comp_queue) if q})),
        when=_condition(when),
        pivot=pivot,
    )


def human_step(
    name: str,
    *,
    schema: Any = None,
    timeout: float | timedelta = 86400.0,
    escalate_after: float | timedelta | None = None,
    on_timeout: HumanTimeoutPolicy | str = HumanTimeoutPolicy.COMPENSATE,
    depends_on: Iterable[str] | None = None,
    when: Condition | None = None,
    pivot: bool = False,
) -> Step:
    """Build a step a person answers (``saga-tasks signal``, ``POST .../signal``): its
    data, validated by ``schema``, becomes the step's result; ``timeout`` is the deadline
    of the decision, ``escalate_after`` when an alert says it is still missing."""
    wait = _seconds(timeout)
    escalate = None if escalate_after is None else _seconds(escalate_after)
    return Step(
        name=name,
        action="",
        queue="",
        timeout=wait,
        retry=RetryPolicy(max_attempts=1),
        depends_on=_PREVIOUS if depends_on is None else tuple(depends_on),
        when=_condition(when),
        pivot=pivot,
        human=HumanTask(
            schema=_validator(schema),
            schema_name=getattr(schema, "__name__", None) if schema is not None else None,
            fields=_signal_fields(schema),
            escalate_after=escalate,
            on_timeout=HumanTimeoutPolicy(on_timeout),
        ),
    )


def _seconds(value: float | timedelta) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def _condition(value: Any) -> Condition | None:
    if value is not None and not isinstance(value, Condition):
        raise TypeError(
            "when= takes a condition (equals, one_of, exists, ... from saga_tasks), "
            f"not {type(value).__name__}: conditions are data, so replays and versions agree"
        )
    return value


def _target(target: str | CommandTarget) -> tuple[str, str | None]:
    if isinstance(target, str):
        return target, None
    return target.task_name, target.queue


def _policy(value: RetryPolicy | int | None, default: RetryPolicy) -> RetryPolicy:
    if value is None:
        return default
    if isinstance(value, int):
        return RetryPolicy(max_attempts=value)
    return value


PayloadValidator = Callable[[Any], Mapping[str, Any]]


@dataclass(frozen=True)
class SagaDefinition:
    """A validated saga type: steps in a dependency order, with their parents and children."""

    saga_type: str
    steps: tuple[Step, ...]
    version: int = 1
    timeout: timedelta = timedelta(minutes=10)
    payload_validator: PayloadValidator | None = None
    parents: Mapping[str, tuple[str, ...]] = field(init=False, repr=False)
    children: Mapping[str, tuple[str, ...]] = field(init=False, repr=False)
    by_name: Mapping[str, Step] = field(init=False, repr=False)
    _ancestors: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)
    _descendants: Mapping[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.saga_type or not self.saga_type.replace("_", "").replace("-", "").isalnum():
            raise DefinitionError(self.saga_type, "saga type must be a non-empty word")
        if not self.steps:
            raise DefinitionError(self.saga_type, "a saga needs at least one step")
        if self.version < 1:
            raise DefinitionError(self.saga_type, "version must be at least 1")
        resolved = _resolve_dependencies(self.saga_type, self.steps)
        ordered = _topological_order(self.saga_type, resolved)
        by_name = {s.name: s for s in resolved}
        children: dict[str, list[str]] = {s.name: [] for s in resolved}
        for s in resolved:
            for parent in s.depends_on:
                children[parent].append(s.name)
        object.__setattr__(self, "steps", tuple(by_name[n] for n in ordered))
        object.__setattr__(self, "by_name", by_name)
        object.__setattr__(self, "parents", {s.name: s.depends_on for s in resolved})
        object.__setattr__(self, "children", {k: tuple(v) for k, v in children.items()})
        # Read on every decision (compensation order, the pivot): worked out once here.
        object.__setattr__(self, "_ancestors", {n: _reach(self.parents, n) for n in by_name})
        object.__setattr__(self, "_descendants", {n: _reach(self.children, n) for n in by_name})
        _check_conditions(self)
        _check_pivot(self)

    @property
    def queues(self) -> frozenset[str]:
        return frozenset(s.queue for s in self.steps if s.human is None)

    @property
    def pivot(self) -> str | None:
        """The step after whose success the saga only goes forward, if any."""
        return next((s.name for s in self.steps if s.pivot), None)

    def ancestors(self, name: str) -> frozenset[str]:
        """Every step ``name`` depends on, directly or through others."""
        return self._ancestors[name]

    def step(self, name: str) -> Step:
        return self.by_name[name]

    def descendants(self, name: str) -> frozenset[str]:
        """Every step that depends on ``name``, directly or through others."""
        return self._descendants[name]

    def read_by(self, name: str) -> tuple[Step, ...]:
        """The steps whose condition reads the result of step ``name``."""
        return tuple(
            s
            for s in self.steps
            if s.when is not None and any(p.split(".")[0] == name for p in s.when.paths())
        )

    def validate_payload(self, payload: Any) -> dict[str, Any]:
        """Return the payload as stored, or raise ``InvalidPayload`` with every problem named."""
        if self.payload_validator is None:
            if not isinstance(payload, Mapping):
                raise InvalidPayload(f"{self.saga_type}: payload must be a JSON object")
            return _stored(self.saga_type, payload, "the payload")
        try:
            valid = self.payload_validator(payload)
        except InvalidPayload:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidPayload(f"{self.saga_type}: {_describe_validation(exc)}") from exc
        return _stored(self.saga_type, valid, "the payload validator")


def saga(
    saga_type: str,
    *steps: Step,
    version: int = 1,
    timeout: float | timedelta = 600.0,
    payload: Any = None,
) -> SagaDefinition:
    """Build a saga definition; ``payload`` is a pydantic model class or a validating callable."""
    return SagaDefinition(
        saga_type=saga_type,
        steps=tuple(steps),
        version=version,
        timeout=timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout),
        payload_validator=_validator(payload),
    )


def _validator(payload: Any) -> PayloadValidator | None:
    if payload is None:
        return None
    model_validate = getattr(payload, "model_validate", None)
    if model_validate is not None:

        def validate(value: Any) -> Mapping[str, Any]:
            result: Mapping[str, Any] = model_validate(value).model_dump(mode="json")
            return result

        return validate
    if callable(payload):
        return payload  # type: ignore[no-any-return]
    raise TypeError("payload must be a pydantic model class or a callable")


def _signal_fields(schema: Any) -> tuple[SignalField, ...]:
    """The fields of a pydantic model, from its JSON schema; none for anything else."""
    describe = getattr(schema, "model_json_schema", None)
    if describe is None:
        return ()
    found = describe()
    required = set(found.get("required", ()))
    return tuple(
        SignalField(name, _takes(spec), name in required)
        for name, spec in found.get("properties", {}).items()
    )


def _takes(spec: Mapping[str, Any]) -> str:
    """What one property of a JSON schema takes, in a few words."""
    if "enum" in spec:
        return " | ".join(json.dumps(v) for v in spec["enum"])
    if "const" in spec:
        return json.dumps(spec["const"])
    if "anyOf" in spec:
        return " | ".join(_takes(s) for s in spec["anyOf"])
    if "$ref" in spec:
        return str(spec["$ref"]).rsplit("/", 1)[-1]
    kind = spec.get("type", "any")
    if kind == "array" and isinstance(spec.get("items"), Mapping):
        return f"array of {_takes(spec['items'])}"
    return " | ".join(kind) if isinstance(kind, list) else str(kind)


def _stored(what: str, value: Any, made_by: str) -> dict[str, Any]:
    """``value`` as the JSON document stored, once: what is read back (and compared with a
    repeated request) is then what was validated. A value with no one JSON form is
    refused, naming where it is and what made it, not its content (it may be PII)."""
    if not isinstance(value, Mapping):
        raise InvalidPayload(f"{what}: {made_by} returned a {type(value).__name__}, not an object")
    try:
        return json_document(value)
    except NotJson as exc:
        raise InvalidPayload(
            f"{what}: {made_by} returned {exc.where or 'the document'} as a {exc.kind}, "
            "which is not a JSON value; it must return JSON values "
            "(strings for dates and decimals, lists for sets), as a pydantic model's "
            "model_dump(mode='json') does"
        ) from None


def _describe_validation(exc: Exception) -> str:
    """One line per problem, naming the field, without echoing the values (they may be PII)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            items = errors(include_input=False)
        except TypeError:
            items = errors()
        parts = []
        for item in items:
            loc = ".".join(str(p) for p in item.get("loc", ())) or "payload"
            parts.append(f"{loc}: {item.get('msg', 'invalid')}")
        if parts:
            return "; ".join(parts)
    return str(exc)


def _resolve_dependencies(saga_type: str, steps: tuple[Step, ...]) -> tuple[Step, ...]:
    names: set[str] = set()
    resolved: list[Step] = []
    previous: str | None = None
    for s in steps:
        if not s.name:
            raise DefinitionError(saga_type, "a step has an empty name")
        if s.name in names:
            raise DuplicateStep(saga_type, f"step {s.name!r} is defined twice")
        names.add(s.name)
        if s.human is None and not s.queue:
            raise MissingQueue(saga_type, f"step {s.name!r} has no queue")
        if len(s.named_queues) > 1:
            raise CrossParticipantCompensation(
                saga_type,
                f"step {s.name!r} names more than one queue ({', '.join(s.named_queues)}): its "
                "action and its compensation must be handled by one participant, on its queue",
            )
        if s.human is None and not s.action:
            raise DefinitionError(saga_type, f"step {s.name!r} has no action task")
        if s.timeout <= timedelta(0):
            raise DefinitionError(saga_type, f"step {s.name!r} needs a positive timeout")
        depends = s.depends_on
        if depends == _PREVIOUS:
            depends = () if previous is None else (previous,)
        if len(set(depends)) != len(depends):
            raise DefinitionError(saga_type, f"step {s.name!r} lists a dependency twice")
        resolved.append(_replace_depends(s, depends))
        previous = s.name
    for s in resolved:
        for parent in s.depends_on:
            if parent not in names:
                raise UnknownDependency(
                    saga_type, f"step {s.name!r} depends on unknown step {parent!r}"
                )
    return tuple(resolved)


def _reach(edges: Mapping[str, tuple[str, ...]], name: str) -> frozenset[str]:
    """Every step reached from ``name`` through ``edges`` (parents or children)."""
    seen: set[str] = set()
    todo = list(edges[name])
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(edges[current])
    return frozenset(seen)


def _check_conditions(d: SagaDefinition) -> None:
    """A condition reads the payload or steps that are settled before its own: its
    ancestors. Anything else would read a result that may not exist yet."""
    for s in d.steps:
        if s.when is None:
            continue
        ancestors = d.ancestors(s.name)
        for path in sorted(s.when.paths()):
            head = path.split(".")[0]
            if head == PAYLOAD and PAYLOAD in d.by_name:
                raise DefinitionError(
                    d.saga_type,
                    f"step {s.name!r}: condition path {path!r} is ambiguous, a step is named "
                    f"{PAYLOAD!r}; rename that step",
                )
            if head != PAYLOAD and head not in ancestors:
                raise DefinitionError(
                    d.saga_type,
                    f"step {s.name!r}: condition reads {path!r}, but {head!r} is not a step "
                    "it depends on (directly or through others); only the payload and "
                    "settled steps can be read",
                )


def _check_pivot(d: SagaDefinition) -> None:
    """One pivot at most. Steps beside it (another branch) are allowed: whatever has not
    succeeded when the pivot does only goes forward from then on."""
    pivots = [s.name for s in d.steps if s.pivot]
    if not pivots:
        return
    if len(pivots) > 1:
        raise DefinitionError(d.saga_type, f"one pivot at most; marked: {', '.join(pivots)}")
    pivot = pivots[0]
    for name in sorted(d.descendants(pivot)):
        s = d.by_name[name]
        if s.human is not None and s.human.on_timeout is HumanTimeoutPolicy.COMPENSATE:
            raise DefinitionError(
                d.saga_type,
                f"human step {name!r} follows the pivot {pivot!r}: nothing is compensated "
                "after it, so its timeout policy must be manual_review",
            )


def _replace_depends(s: Step, depends: tuple[str, ...]) -> Step:
    return replace(s, depends_on=depends)


def _topological_order(saga_type: str, steps: tuple[Step, ...]) -> list[str]:
    """Kahn's algorithm, stable in the listed order; what is left over lies on a cycle."""
    pending = {s.name: set(s.depends_on) for s in steps}
    order: list[str] = []
    while pending:
        ready = [name for name, deps in pending.items() if not deps]
        if not ready:
            cycle = " -> ".join(_find_cycle(pending))
            raise DependencyCycle(saga_type, f"steps depend on each other in a cycle: {cycle}")
        for name in ready:
            order.append(name)
            del pending[name]
        for deps in pending.values():
            deps.difference_update(ready)
    return order


def _find_cycle(pending: Mapping[str, set[str]]) -> list[str]:
    start = next(iter(pending))
    path = [start]
    seen = {start}
    current = start
    while True:
        current = next(iter(sorted(pending[current])))
        if current in seen:
            return [*path[path.index(current) :], current]
        path.append(current)
        seen.add(current)
