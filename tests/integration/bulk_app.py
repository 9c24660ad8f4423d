"""The app of the bulk-action test: a saga whose second step is refused and whose first
step's compensation is refused too, so every saga ends in MANUAL_REVIEW. The CLI loads it
as ``tests.integration.bulk_app:saga_app`` with the test's environment."""

from __future__ import annotations

from typing import Any

from saga_tasks import CommandContext, Participant, SagaApp, Settings, saga, step
from saga_tasks.errors import BusinessRejection

desk = Participant("bulkdesk")


@desk.command("hold")
def hold(ctx: CommandContext) -> dict[str, Any]:
    return {"held": True}


@desk.compensation("unhold", undoes="hold")
def unhold(ctx: CommandContext) -> None:
    raise BusinessRejection("locked", "the hold is locked")


@desk.command("charge")
def charge(ctx: CommandContext) -> None:
    raise BusinessRejection("declined", "card declined")


STUCK = saga(
    "stuck",
    step("hold", hold, compensation=unhold, timeout=60),
    step("charge", charge, timeout=60, depends_on=["hold"]),
)


def build(settings: Settings) -> SagaApp:
    return SagaApp(sagas=[STUCK], participants=[desk], settings=settings)


def __getattr__(name: str) -> Any:
    if name == "saga_app":  # built when the CLI asks, from its environment
        return build(Settings.from_env())
    raise AttributeError(name)
