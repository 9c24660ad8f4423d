"""saga_tasks: saga orchestration for Celery, RabbitMQ as transport, PostgreSQL as the truth."""

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
