"""What an operator does to one saga: an action (retry a step, skip it, compensate,
resolve), a migration to another definition version, a person's signal; each audited
with the token's actor."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from saga_tasks.ops.operator import act as do
from saga_tasks.ops.operator import migrate as migrate_saga
from saga_tasks.ops.operator import signal as give_signal
from saga_tasks.web.deps import App, Operator, answer
from saga_tasks.web.models import Action, ActionRequest, MigrateRequest, SignalRequest
from saga_tasks.web.problems import invalid

router = APIRouter(tags=["operators"])


@router.post("/sagas/{saga_id}/migrate")
def migrate(
    request: Request,
    app: App,
    saga_id: Annotated[str, Path(max_length=100)],
    body: MigrateRequest,
    caller: Operator,
) -> dict[str, Any]:
    """Move a saga to another version of its definition that this server loads (every
    step it began must be there unchanged), audited with the token's actor. Answers
    like every action: the saga, or without the read scope ``{saga_id, outcome,
    version}``."""
    view = migrate_saga(
        app,
        saga_id,
        body.to_version,
        actor=caller.name,
        reason=body.reason,
        expect_version=body.expect_version,
    )
    return answer(request, caller, view)


@router.post("/sagas/{saga_id}/{action}")
def act(
    request: Request,
    app: App,
    saga_id: Annotated[str, Path(max_length=100)],
    action: Action,
    body: ActionRequest,
    caller: Operator,
) -> dict[str, Any]:
    """An operator action, audited with the token's actor. Answers the saga as it is
    after it, with the ``outcome``; a token without the read scope is answered only
    ``{saga_id, outcome, version}``: acting on a saga is not reading it."""
    if action in ("retry-step", "skip-step") and not body.step:
        raise invalid(f"{action} needs a step")
    if action == "resolve" and not body.status:
        raise invalid("resolve needs a status")
    view = do(
        app,
        saga_id,
        action.replace("-", "_"),
        actor=caller.name,
        reason=body.reason,
        expect_version=body.expect_version,
        step=body.step,
        resolution=body.status,
    )
    return answer(request, caller, view)


@router.post("/sagas/{saga_id}/steps/{step}/signal")
def signal(
    request: Request,
    app: App,
    saga_id: Annotated[str, Path(max_length=100)],
    step: Annotated[str, Path(max_length=200)],
    body: SignalRequest,
    caller: Operator,
) -> dict[str, Any]:
    """A person's decision on a human step, audited with the token's actor. Data the
    step's schema refuses: 422, nothing changes; a step not waiting: 409. The same
    decision again is answered as a duplicate (``outcome``), whatever
    ``expect_version`` says, so a client may retry; another one is held to it.
    Answers like every action: the saga, or without the read scope ``{saga_id,
    outcome, version}``."""
    view = give_signal(
        app,
        saga_id,
        step,
        body.data,
        actor=caller.name,
        reason=body.reason,
        expect_version=body.expect_version,
    )
    return answer(request, caller, view)
