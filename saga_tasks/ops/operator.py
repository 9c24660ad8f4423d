"""Operator actions on sagas, shared by the CLI and the HTTP API.

Every action names an actor and a reason, states the saga version it was decided
on (``expect_version``), and is written to the saga's history. The rules of what an
action may do live in the decider; this module only carries the request there.
"""

from __future__ import annotations

from typing import Any

from saga_tasks.app import SagaApp
from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.errors import InputError
from saga_tasks.ops.views import saga_view


def act(
    app: SagaApp,
    saga_id: str,
    verb: OperatorVerb | str,
    *,
    actor: str,
    reason: str,
    expect_version: int,
    step: str | None = None,
    resolution: str | None = None,
) -> dict[str, Any]:
    """Apply one operator action; return the saga as ``show`` prints it, with the
    ``outcome`` (``accepted``: a refused action raises)."""
    if not actor.strip() or not reason.strip():
        raise InputError("an operator action needs --actor and --reason")
    action = OperatorAction(
        verb=OperatorVerb(verb),
        actor=actor.strip(),
        reason=reason.strip(),
        step=step,
        resolution=resolution.upper() if resolution else None,
    )
    app.orchestrator.act(saga_id, action, expect_version=expect_version)
    return {**saga_view(app, saga_id), "outcome": "accepted"}


def signal(
    app: SagaApp,
    saga_id: str,
    step: str,
    data: Any,
    *,
    actor: str,
    reason: str,
    expect_version: int | None = None,
) -> dict[str, Any]:
    """A person's decision on a human step; return the saga as ``show`` prints it, with
    the ``outcome``: ``accepted``, or ``duplicate`` for the same decision again. Data
    that the step's schema refuses raises ``InvalidPayload`` and changes nothing."""
    if not actor.strip() or not reason.strip():
        raise InputError("a signal needs --actor and --reason")
    decision = app.orchestrator.signal(
        saga_id, step, data, actor=actor, reason=reason, expect_version=expect_version
    )
    return {**saga_view(app, saga_id), "outcome": decision.classification.value}


def migrate(
    app: SagaApp,
    saga_id: str,
    to_version: int,
    *,
    actor: str,
    reason: str,
    expect_version: int | None = None,
) -> dict[str, Any]:
    """Move a saga to another loaded version of its definition; return it as ``show``
    prints it, with the ``outcome`` (``accepted``)."""
    if not actor.strip() or not reason.strip():
        raise InputError("a migration needs --actor and --reason")
    app.orchestrator.migrate(
        saga_id,
        to_version,
        actor=actor.strip(),
        reason=reason.strip(),
        expect_version=expect_version,
    )
    return {**saga_view(app, saga_id), "outcome": "accepted"}
