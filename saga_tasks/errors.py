"""One error tree for saga_tasks, split by what the caller should do about it.

    SagaTasksError
    ├── ConfigurationError            bug in set-up: fix the code or the settings
    │   ├── DefinitionError           a saga definition is not a valid DAG of steps
    │   │   ├── DuplicateStep
    │   │   ├── UnknownDependency
    │   │   ├── DependencyCycle
    │   │   ├── MissingQueue
    │   │   └── CrossParticipantCompensation  a step undone by another participant
    │   ├── ScheduleError             a schedule is invalid, or does not fit its saga
    │   │   ├── InvalidCron
    │   │   ├── InvalidInterval
    │   │   ├── DuplicateSchedule
    │   │   ├── UnknownScheduledSaga
    │   │   └── InvalidScheduledPayload
    │   ├── UnknownDefinitionVersion  a running saga's definition is not loaded here
    │   ├── WebhookRefused            the alert webhook points where no alert may go
    │   └── TopologyMismatch          a queue exists on the broker with other arguments,
    │                                 or is missing where the deploy step declares it
    ├── InputError                    refuse: the caller sent something wrong (CLI exit 2)
    │   ├── UnknownSagaType
    │   ├── InvalidPayload
    │   ├── BusinessKeyConflict
    │   ├── SagaNotFound
    │   │   └── SagaPurged        it existed, and was purged after its retention
    │   ├── ActionRefused         an operator action that does not fit the saga's state
    │   └── VersionMismatch       --expect-version is not the saga's version
    ├── InvalidMessage                park: a message that makes no sense, never retried
    │   └── SenderRefused             from a broker user that may not send it
    ├── ServiceUnavailable            retry: PostgreSQL, RabbitMQ or Redis cannot be reached
    │   └── PublishFailed             the broker did not confirm a publish
    ├── SagaOverloaded                retry later: admission control refused a start
    │                                 (HTTP 429 with Retry-After, CLI exit 4)
    ├── ConcurrencyConflict           retry: another transaction moved the saga first
    ├── TransientError                retry: raised by participant code for passing faults
    └── BusinessRejection             give up: a business rule refused the command

Retryability is data on the class (``retryable``), so the wiring never needs to
know the concrete type. Database and broker exceptions are translated into these
at the boundary (``persistence.db`` and ``messaging.publisher``).
"""

from __future__ import annotations

from typing import Any, ClassVar


class SagaTasksError(Exception):
    """Base of every error raised by saga_tasks."""

    retryable: ClassVar[bool] = False


class ConfigurationError(SagaTasksError):
    """The code or the settings are wrong; retrying cannot help."""


class DefinitionError(ConfigurationError):
    """A saga definition is invalid; raised when it is built, never at run time."""

    def __init__(self, saga_type: str, problem: str) -> None:
        super().__init__(f"saga {saga_type!r}: {problem}")
        self.saga_type = saga_type
        self.problem = problem


class DuplicateStep(DefinitionError):
    """Two steps share a name."""


class UnknownDependency(DefinitionError):
    """A step depends on a step that is not in the definition."""


class DependencyCycle(DefinitionError):
    """The dependencies of the steps form a cycle."""


class MissingQueue(DefinitionError):
    """A step has no queue to send its commands to."""


class CrossParticipantCompensation(DefinitionError):
    """A step's compensation belongs to another participant than its action.

    The compensation would look for the forward command in the wrong ledger: it would
    report "nothing to undo" while the effect stays, and leave its tombstone where the
    forward command never looks.
    """


class ScheduleError(ConfigurationError):
    """A schedule is invalid; raised when it is built or when the app is, never at run time."""

    def __init__(self, schedule: str, problem: str) -> None:
        super().__init__(f"schedule {schedule!r}: {problem}")
        self.schedule = schedule
        self.problem = problem


class InvalidCron(ScheduleError):
    """The cron expression cannot be read, or names a time that never comes (31 February)."""


class InvalidInterval(ScheduleError):
    """The interval (or the grace) is not a positive number of seconds, or is below what
    beat can keep (it wakes about once a second)."""


class DuplicateSchedule(ScheduleError):
    """Two schedules share a name, or would start sagas of one type under one key."""


class UnknownScheduledSaga(ScheduleError):
    """A schedule names a saga type the app does not have."""


class InvalidScheduledPayload(ScheduleError):
    """A schedule's fixed payload does not satisfy its saga type's schema (or is not JSON)."""


class UnknownDefinitionVersion(ConfigurationError):
    """A saga started with a definition version this process does not have."""


class TopologyMismatch(ConfigurationError):
    """A queue or exchange exists on the broker with arguments other than ours, or is
    missing where the deploy step (not the workers) declares the topology."""


class WebhookRefused(ConfigurationError):
    """``SAGA_ALERT_WEBHOOK``, or an address its host resolves to, is one the alerter must
    not reach (``observability.webhook``); the message names the host, never the path or
    query, where a token may sit."""


class InputError(SagaTasksError):
    """The caller's input is wrong: refused before anything is written."""


class UnknownSagaType(InputError):
    """No saga definition of that type is registered."""


class InvalidPayload(InputError):
    """The payload does not satisfy the saga type's schema."""


class BusinessKeyConflict(InputError):
    """The business key already names a saga started with a different payload."""

    def __init__(self, message: str, saga_id: str) -> None:
        super().__init__(message)
        self.saga_id = saga_id


class SagaNotFound(InputError):
    """No saga has that id."""


class SagaPurged(SagaNotFound):
    """The saga existed, finished, and was purged after its retention: its tombstone
    says how it ended and when (``status``, ``finished_at``, ``purged_at``)."""

    def __init__(self, saga_id: str, *, status: str, finished_at: Any, purged_at: Any) -> None:
        purged_utc = _utc(purged_at)
        ended = f" at {_utc(finished_at):%Y-%m-%d %H:%M} UTC" if finished_at is not None else ""
        super().__init__(
            f"saga {saga_id} was purged at {purged_utc:%Y-%m-%d %H:%M} UTC after its retention "
            f"(it ended {status}{ended})"
        )
        self.saga_id = saga_id
        self.status = status
        self.finished_at = finished_at
        self.purged_at = purged_at


def _utc(at: Any) -> Any:
    """A time from the database (in the session's zone) shown in UTC."""
    from datetime import UTC

    return at.astimezone(UTC) if getattr(at, "tzinfo", None) is not None else at


class ActionRefused(InputError):
    """An operator action that the saga's current state does not allow; says why."""


class VersionMismatch(InputError):
    """The operator acted on a version of the saga that is no longer current."""

    def __init__(self, message: str, current: int) -> None:
        super().__init__(message)
        self.current = current


class InvalidMessage(SagaTasksError):
    """A message that makes no sense here: recorded and parked, never retried."""

    def __init__(self, reason: str, **context: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.context = context


class SenderRefused(InvalidMessage):
    """A message whose AMQP ``user_id`` is not a user allowed to send it (or is missing):
    recorded, counted and parked like any invalid message; it changes nothing."""


def first_line(error: BaseException) -> str:
    """The first line of a driver's error (its ``orig`` when wrapped), for a message."""
    orig = getattr(error, "orig", None) or error
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


class ServiceUnavailable(SagaTasksError):
    """A backing service cannot be reached; the message names it and its URL.

    The one way such an error is made, so none can leak a password: ``url`` is masked
    here, and ``detail`` (a text, or the driver's error, of which the first line is
    kept) is scrubbed of every piece of the URL's password and cut to 300 characters.
    """

    retryable = True

    def __init__(self, service: str, url: str, detail: str | BaseException) -> None:
        from saga_tasks.urls import mask_url, scrub

        text = first_line(detail) if isinstance(detail, BaseException) else detail
        self.service = service
        self.url = mask_url(url)
        self.detail = scrub(text, url)[:300]
        super().__init__(f"cannot reach {service} at {self.url}: {self.detail}")


class PublishFailed(ServiceUnavailable):
    """The broker refused or did not confirm a publish; the outbox keeps the message."""


class SagaOverloaded(SagaTasksError):
    """Admission control: too many sagas of this type are active, or a queue they send to
    holds too many commands waiting for capacity. Nothing was started; try again after
    ``retry_after`` seconds."""

    retryable = True

    def __init__(self, message: str, *, retry_after: int, reason: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason


class ConcurrencyConflict(SagaTasksError):
    """The saga's version moved under us; the work is safe to run again."""

    retryable = True


class TransientError(SagaTasksError):
    """Participant code says: this may work later (a timeout, a 503)."""

    retryable = True


class BusinessRejection(SagaTasksError):
    """Participant code says: this command is refused by a business rule.

    The participant framework turns it into a failure reply; the saga compensates.
    ``code`` is a stable machine-readable word; ``message`` must carry no PII.
    """

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
