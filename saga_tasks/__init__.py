"""saga_tasks: saga orchestration for Celery, RabbitMQ as transport, PostgreSQL as the truth."""

# Names load on first use (PEP 562): ``import saga_tasks.ops.cli`` or a participant's
# module then pays for what it uses, not for Celery, kombu and the web stack, and an
# operator's read command answers quickly.
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp, default_app, load_app, start_saga
    from saga_tasks.config import Settings
    from saga_tasks.core.conditions import (
        Condition,
        all_of,
        any_of,
        at_least,
        at_most,
        equals,
        exists,
        greater,
        less,
        negate,
        not_equals,
        one_of,
    )
    from saga_tasks.core.decider import CommandIntent, Decision, HistoryEntry, decide
    from saga_tasks.core.definitions import (
        HumanTimeoutPolicy,
        LateReplyPolicy,
        RetryPolicy,
        SagaDefinition,
        Step,
        human_step,
        saga,
        step,
    )
    from saga_tasks.core.events import ReplyReceived, SignalReceived, Started
    from saga_tasks.core.model import SagaState, StepState
    from saga_tasks.core.schedules import Schedule, schedule
    from saga_tasks.core.states import SagaStatus, StepStatus
    from saga_tasks.errors import (
        BusinessKeyConflict,
        BusinessRejection,
        ConfigurationError,
        CrossParticipantCompensation,
        DefinitionError,
        DependencyCycle,
        DuplicateStep,
        InputError,
        InvalidMessage,
        InvalidPayload,
        MissingQueue,
        SagaNotFound,
        SagaTasksError,
        ScheduleError,
        ServiceUnavailable,
        TransientError,
        UnknownDependency,
        UnknownSagaType,
    )
    from saga_tasks.participant import CommandContext, Participant
    from saga_tasks.runtime.orchestrator import SagaHandle

__all__ = [
    # defining sagas
    "HumanTimeoutPolicy",
    "LateReplyPolicy",
    "RetryPolicy",
    "SagaDefinition",
    "Step",
    "human_step",
    "saga",
    "step",
    # conditions (when=)
    "Condition",
    "all_of",
    "any_of",
    "at_least",
    "at_most",
    "equals",
    "exists",
    "greater",
    "less",
    "negate",
    "not_equals",
    "one_of",
    # starting sagas on a schedule
    "Schedule",
    "schedule",
    # writing participants
    "BusinessRejection",
    "CommandContext",
    "Participant",
    "TransientError",
    # running
    "SagaApp",
    "SagaHandle",
    "Settings",
    "default_app",
    "load_app",
    "start_saga",
    # the pure core
    "CommandIntent",
    "Decision",
    "HistoryEntry",
    "ReplyReceived",
    "SignalReceived",
    "SagaState",
    "SagaStatus",
    "Started",
    "StepState",
    "StepStatus",
    "decide",
    # errors
    "BusinessKeyConflict",
    "ConfigurationError",
    "DefinitionError",
    "CrossParticipantCompensation",
    "DependencyCycle",
    "DuplicateStep",
    "InputError",
    "InvalidMessage",
    "InvalidPayload",
    "MissingQueue",
    "SagaNotFound",
    "SagaTasksError",
    "ScheduleError",
    "ServiceUnavailable",
    "UnknownDependency",
    "UnknownSagaType",
]

_WHERE = {
    "SagaApp": "saga_tasks.app",
    "default_app": "saga_tasks.app",
    "load_app": "saga_tasks.app",
    "start_saga": "saga_tasks.app",
    "Settings": "saga_tasks.config",
    "Condition": "saga_tasks.core.conditions",
    "all_of": "saga_tasks.core.conditions",
    "any_of": "saga_tasks.core.conditions",
    "at_least": "saga_tasks.core.conditions",
    "at_most": "saga_tasks.core.conditions",
    "equals": "saga_tasks.core.conditions",
    "exists": "saga_tasks.core.conditions",
    "greater": "saga_tasks.core.conditions",
    "less": "saga_tasks.core.conditions",
    "negate": "saga_tasks.core.conditions",
    "not_equals": "saga_tasks.core.conditions",
    "one_of": "saga_tasks.core.conditions",
    "CommandIntent": "saga_tasks.core.decider",
    "Decision": "saga_tasks.core.decider",
    "HistoryEntry": "saga_tasks.core.decider",
    "decide": "saga_tasks.core.decider",
    "HumanTimeoutPolicy": "saga_tasks.core.definitions",
    "LateReplyPolicy": "saga_tasks.core.definitions",
    "RetryPolicy": "saga_tasks.core.definitions",
    "SagaDefinition": "saga_tasks.core.definitions",
    "Step": "saga_tasks.core.definitions",
    "human_step": "saga_tasks.core.definitions",
    "saga": "saga_tasks.core.definitions",
    "step": "saga_tasks.core.definitions",
    "ReplyReceived": "saga_tasks.core.events",
    "SignalReceived": "saga_tasks.core.events",
    "Started": "saga_tasks.core.events",
    "SagaState": "saga_tasks.core.model",
    "StepState": "saga_tasks.core.model",
    "Schedule": "saga_tasks.core.schedules",
    "schedule": "saga_tasks.core.schedules",
    "SagaStatus": "saga_tasks.core.states",
    "StepStatus": "saga_tasks.core.states",
    "BusinessKeyConflict": "saga_tasks.errors",
    "BusinessRejection": "saga_tasks.errors",
    "ConfigurationError": "saga_tasks.errors",
    "CrossParticipantCompensation": "saga_tasks.errors",
    "DefinitionError": "saga_tasks.errors",
    "DependencyCycle": "saga_tasks.errors",
    "DuplicateStep": "saga_tasks.errors",
    "InputError": "saga_tasks.errors",
    "InvalidMessage": "saga_tasks.errors",
    "InvalidPayload": "saga_tasks.errors",
    "MissingQueue": "saga_tasks.errors",
    "SagaNotFound": "saga_tasks.errors",
    "SagaTasksError": "saga_tasks.errors",
    "ScheduleError": "saga_tasks.errors",
    "ServiceUnavailable": "saga_tasks.errors",
    "TransientError": "saga_tasks.errors",
    "UnknownDependency": "saga_tasks.errors",
    "UnknownSagaType": "saga_tasks.errors",
    "CommandContext": "saga_tasks.participant",
    "Participant": "saga_tasks.participant",
    "SagaHandle": "saga_tasks.runtime.orchestrator",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'saga_tasks' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
