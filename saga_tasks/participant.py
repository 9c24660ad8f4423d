"""Participants: turning business functions into command handlers on a participant's queue.

    inventory = Participant("inventory")          # queue inventory.commands, schema inventory

    @inventory.command("reserve")
    def reserve(ctx: CommandContext) -> dict: ...  # raise BusinessRejection to refuse

    @inventory.compensation("release", undoes="reserve")
    def release(ctx: CommandContext) -> dict: ...

    @inventory.command("hold", payload=HoldIn)    # a pydantic model of the saga's payload
    def hold(ctx: CommandContext, order: HoldIn) -> dict: ...

This module only declares; ``saga_tasks.runtime.participant`` runs the handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, get_args, overload

from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection, MetaData, Table

from saga_tasks.core.messages import Command
from saga_tasks.core.states import MessageKind
from saga_tasks.errors import BusinessRejection
from saga_tasks.messaging.topology import command_queue
from saga_tasks.persistence.tables import ledger_table, outbox_table, redelivery_table


@dataclass(frozen=True)
class CommandContext:
    """What a handler gets: the open transaction and the command."""

    conn: Connection
    command: Command
    now: datetime

    @property
    def saga_id(self) -> str:
        return self.command.saga_id

    @property
    def command_id(self) -> str:
        return self.command.command_id

    @property
    def payload(self) -> Mapping[str, Any]:
        return self.command.payload

    def result_of(self, step: str) -> Mapping[str, Any]:
        """What an earlier step returned; empty if it returned nothing."""
        return self.command.results.get(step) or {}


HandlerFunction = Callable[[CommandContext], Mapping[str, Any] | None]
M = TypeVar("M", bound=BaseModel)
TypedHandlerFunction = Callable[[CommandContext, M], Mapping[str, Any] | None]

INVALID_PAYLOAD = "invalid_payload"
"""The code of the failure a handler's ``payload=`` model answers for a payload it refuses."""


SHOWN_ERRORS = 5
"""Errors a refusal names; the rest are counted."""


def refusal(model: type[BaseModel], error: ValidationError) -> BusinessRejection:
    """The failure a payload the model refuses makes: where and why, never a value.

    A location names fields of the model (and of the models inside it) and list
    positions only; any other part of it comes from the payload (a dict's key, an extra
    key refused, a tagged union's tag) and shows as ``*``. At most ``SHOWN_ERRORS``
    errors are named, the rest counted, so a refusal stays short however bad the payload.
    """
    names = _field_names(model)

    def where(loc: tuple[int | str, ...]) -> str:
        parts = [str(p) if isinstance(p, int) or p in names else "*" for p in loc]
        return ".".join(parts) or "(payload)"

    errors = error.errors(include_input=False, include_url=False, include_context=False)
    shown = "; ".join(f"{where(e['loc'])}: {e['type']}" for e in errors[:SHOWN_ERRORS])
    more = f"; +{len(errors) - SHOWN_ERRORS} more" if len(errors) > SHOWN_ERRORS else ""
    return BusinessRejection(
        INVALID_PAYLOAD, f"{model.__name__} refused the payload ({shown}{more})"
    )


def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """The field names and aliases of ``model`` and of every model its fields hold."""
    found: set[str] = set()
    seen: set[type] = set()
    todo: list[Any] = [model]
    while todo:
        hint = todo.pop()
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            if hint in seen:
                continue
            seen.add(hint)
            for name, info in hint.model_fields.items():
                found.add(name)
                found.update(a for a in (info.alias, info.validation_alias) if isinstance(a, str))
                todo.append(info.annotation)
        else:
            todo.extend(get_args(hint))
    return frozenset(found)


@dataclass(frozen=True)
class Handler:
    """A business function bound to a task name and a queue; callable as the function."""

    participant: str
    action: str
    kind: MessageKind
    fn: Callable[..., Mapping[str, Any] | None]
    """The function: ``fn(ctx)``, or ``fn(ctx, model)`` with ``payload``."""
    queue: str
    undoes: str | None = None
    payload: type[BaseModel] | None = None
    """A pydantic model of the saga's payload: validated at receipt and passed to ``fn``
    after the context; a payload it refuses fails the step with ``invalid_payload`` (a
    payload never changes, so no retry could succeed) and the saga compensates."""

    @property
    def task_name(self) -> str:
        return f"{self.participant}.{self.action}"

    def __call__(self, ctx: CommandContext) -> Mapping[str, Any] | None:
        if self.payload is None:
            return self.fn(ctx)
        try:
            model = self.payload.model_validate(dict(ctx.payload))
        except ValidationError as error:
            raise refusal(self.payload, error) from None
        return self.fn(ctx, model)


class Participant:
    """A service that owns a queue, a database schema, a command ledger and an outbox.

    Its tables live in its own database (``SAGA_PARTICIPANT_DATABASE_URL``), created by
    its own Alembic chain (``migrations``, a script directory), which
    ``saga-tasks db upgrade`` applies there.
    """

    def __init__(
        self,
        name: str,
        *,
        schema: str | None = None,
        queue: str | None = None,
        migrations: str | Path | None = None,
        max_in_flight: int | None = None,
        rate_limit: float | None = None,
        batch: int = 1,
    ) -> None:
        if not name.isidentifier():
            raise ValueError(f"participant name {name!r} must be an identifier")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a whole number of commands, 1 or more, not {batch!r}")
        if (max_in_flight is not None and max_in_flight < 0) or (
            rate_limit is not None and rate_limit < 0
        ):
            raise ValueError("max_in_flight and rate_limit must be 0 (no limit) or more")
        self.name = name
        self.max_in_flight = max_in_flight
        """Commands sent to its queue and unanswered at once; None: ``SAGA_MAX_IN_FLIGHT``.
        A deployment's ``SAGA_MAX_IN_FLIGHT`` entry naming it overrides this."""
        self.rate_limit = rate_limit
        """Commands per second sent to its queue; None: ``SAGA_RATE_LIMIT``."""
        self.batch = batch
        """Commands a solo (or threads) worker runs in one transaction (group commit), out
        of those it holds; 1: each its own Celery task. A rolled-back batch runs each
        command again alone, so more than 1 only for handlers that touch nothing but this
        participant's database (no calls out, no mail): they may run twice uncommitted."""
        self.schema = schema or name
        self.queue = queue or command_queue(name)
        self.migrations = Path(migrations) if migrations is not None else None
        self.metadata = MetaData(schema=self.schema)
        """Where its tables are declared (``Table(name, p.metadata, ...)``): in its schema
        unless one says ``schema=``; autogenerate compares its chain against it."""
        self.ledger: Table = ledger_table(self.schema, self.metadata)
        self.outbox: Table = outbox_table(self.schema, self.metadata)
        self.redelivery: Table = redelivery_table(self.schema, self.metadata)
        self.handlers: dict[str, Handler] = {}

    @overload
    def command(self, action: str) -> Callable[[HandlerFunction], Handler]: ...
    @overload
    def command(
        self, action: str, *, payload: type[M]
    ) -> Callable[[TypedHandlerFunction[M]], Handler]: ...
    def command(self, action: str, *, payload: type[BaseModel] | None = None) -> Any:
        """A command handler; with ``payload=Model`` it also gets the validated model."""
        return self._register(action, MessageKind.COMMAND, None, payload)

    @overload
    def compensation(self, action: str, *, undoes: str) -> Callable[[HandlerFunction], Handler]: ...
    @overload
    def compensation(
        self, action: str, *, undoes: str, payload: type[M]
    ) -> Callable[[TypedHandlerFunction[M]], Handler]: ...
    def compensation(
        self, action: str, *, undoes: str, payload: type[BaseModel] | None = None
    ) -> Any:
        """The handler that undoes command ``undoes`` of this participant."""
        return self._register(action, MessageKind.COMPENSATION, undoes, payload)

    def _register(
        self,
        action: str,
        kind: MessageKind,
        undoes: str | None,
        payload: type[BaseModel] | None,
    ) -> Callable[[Callable[..., Mapping[str, Any] | None]], Handler]:
        if action in self.handlers:
            raise ValueError(f"{self.name}.{action} is defined twice")
        if payload is not None and not (
            isinstance(payload, type) and issubclass(payload, BaseModel)
        ):
            raise TypeError(f"{self.name}.{action}: payload= takes a pydantic model class")

        def decorate(fn: Callable[..., Mapping[str, Any] | None]) -> Handler:
            handler = Handler(self.name, action, kind, fn, self.queue, undoes, payload)
            self.handlers[action] = handler
            return handler

        return decorate

    def __repr__(self) -> str:
        return f"Participant({self.name!r}, queue={self.queue!r})"
