# The public names of saga_tasks, each written once, here, grouped by concern: type checkers
# read this file, and at run time ``__init__.py`` reads it to learn where each name lives
# and loads it from there on first use. The decider's values, for tests, are in
# ``saga_tasks.testing``; every error a user catches is in ``saga_tasks.errors``.

# defining sagas
from saga_tasks.core.definitions import (
    RetryPolicy as RetryPolicy,
    SagaDefinition as SagaDefinition,
    Step as Step,
    human_step as human_step,
    saga as saga,
    step as step,
)

# conditions (when=)
from saga_tasks.core.conditions import (
    Condition as Condition,
    all_of as all_of,
    any_of as any_of,
    at_least as at_least,
    at_most as at_most,
    equals as equals,
    exists as exists,
    greater as greater,
    less as less,
    negate as negate,
    not_equals as not_equals,
    one_of as one_of,
)

# starting sagas on a schedule
from saga_tasks.core.schedules import Schedule as Schedule, schedule as schedule

# writing participants
from saga_tasks.participant import CommandContext as CommandContext, Participant as Participant

# running: the app, a start and what it returns, the settings
from saga_tasks.app import SagaApp as SagaApp, start_saga as start_saga
from saga_tasks.runtime.orchestrator import SagaHandle as SagaHandle
from saga_tasks.core.states import SagaStatus as SagaStatus
from saga_tasks.config import Settings as Settings

# the error tree (its docstring draws it)
from saga_tasks import errors as errors
