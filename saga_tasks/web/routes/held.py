"""Messages taken off the dead-letter queue or the parking lot: listed, shown (bodies to
``operate`` only, redacted), replayed after their checks, or discarded."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request

from saga_tasks.errors import ActionRefused, InputError
from saga_tasks.ops.views import held_list, held_outcome, held_show
from saga_tasks.web.deps import App, Operator, Reader, held_for
from saga_tasks.web.models import HeldActionRequest
from saga_tasks.web.problems import Problem, invalid

router = APIRouter(tags=["held messages"])


def _not_found(exc: InputError) -> Problem:
    return Problem(404, "held-message-not-found", "No such held message", str(exc))


@router.get("/held")
def held_messages(
    app: App,
    _caller: Reader,
    holding: Literal["dead_letter", "parking"] = "dead_letter",
    status: Literal["pending", "replayed", "discarded", "all"] = "pending",
    saga_id: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> dict[str, Any]:
    """Messages taken off the dead-letter queue or the parking lot (no bodies)."""
    if saga_id is not None:
        try:
            saga_id = str(uuid.UUID(saga_id))
        except ValueError:
            raise invalid("saga_id is not a UUID") from None
    return held_list(
        app, holding, status=None if status == "all" else status, saga_id=saga_id, limit=limit
    )


@router.get("/held/{held_id}")
def held_message(
    request: Request, app: App, held_id: Annotated[int, Path(ge=1, le=2**62)], caller: Reader
) -> dict[str, Any]:
    """One held message, with the checks a replay would run now. Its body and headers
    only for the operate scope, with the fields of SAGA_REDACT_FIELDS masked."""
    try:
        return held_for(request, caller, held_show(app, held_id))
    except InputError as exc:
        raise _not_found(exc) from exc


@router.post("/held/{held_id}/{verb}")
def held_action(
    request: Request,
    app: App,
    held_id: Annotated[int, Path(ge=1, le=2**62)],
    verb: Literal["replay", "discard"],
    body: HeldActionRequest,
    caller: Operator,
) -> dict[str, Any]:
    """Replay (after its checks) or discard a held message, audited with the token's
    actor. Answers the held message as it is now; a token without the read scope is
    answered only ``{held_id, saga_id, outcome, version}`` (the saga's version)."""
    try:
        if verb == "replay":
            app.replayer.replay(
                held_id,
                actor=caller.name,
                reason=body.reason,
                force=body.force,
                force_reason=body.force_reason,
                expect_version=body.expect_version,
            )
        else:
            app.replayer.discard(held_id, actor=caller.name, reason=body.reason)
    except ActionRefused:
        raise
    except InputError as exc:
        if "no held message" in str(exc):
            raise _not_found(exc) from exc
        raise
    if request.app.state.gate.reads(caller):
        return held_for(request, caller, held_show(app, held_id))
    return held_outcome(app, held_id)
