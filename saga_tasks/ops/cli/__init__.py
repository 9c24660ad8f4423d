"""``saga-tasks``: start, inspect and list sagas; migrate the schema; declare the topology.

Exit codes: 0 success, 1 configuration problem, 2 bad input (malformed JSON, unknown
saga type or id, invalid payload), 3 a backing service cannot be reached, 4 a start
refused by admission control. Errors are one line on stderr, never a stack trace.

Other distributions add commands through the entry-point group ``saga_tasks.commands``,
each entry a ``click.Command``. A command is imported only when it is run or listed by
``--help``; one that cannot be imported is an error naming it, with exit code 1.
"""

from __future__ import annotations

import click

from saga_tasks.ops.cli import bulk, deploy, held, operators, sagas, schedules
from saga_tasks.ops.cli.base import (
    EXIT_CONFIG,
    EXIT_INPUT,
    EXIT_OVERLOADED,
    EXIT_UNAVAILABLE,
    Context,
)
from saga_tasks.ops.cli.plugins import COMMANDS_GROUP, Commands

__all__ = [
    "COMMANDS_GROUP",
    "EXIT_CONFIG",
    "EXIT_INPUT",
    "EXIT_OVERLOADED",
    "EXIT_UNAVAILABLE",
    "main",
]


@click.group(cls=Commands)
@click.option("--app", "app_spec", envvar="SAGA_TASKS_APP", help="module:attribute of the SagaApp.")
@click.pass_context
def main(ctx: click.Context, app_spec: str | None) -> None:
    """Saga orchestration on Celery, RabbitMQ and PostgreSQL."""
    named = ctx.get_parameter_source("app_spec") is click.core.ParameterSource.COMMANDLINE
    ctx.obj = Context(app_spec, named=named)


main.add_command(deploy.check)
main.add_command(deploy.db)
main.add_command(deploy.broker)
main.add_command(deploy.init)
main.add_command(sagas.start)
main.add_command(sagas.show)
main.add_command(sagas.list_)
main.add_command(sagas.invalid)
main.add_command(sagas.describe)
main.add_command(schedules.schedules)
main.add_command(operators.retry_step)
main.add_command(operators.signal)
main.add_command(operators.skip_step)
main.add_command(operators.compensate)
main.add_command(operators.cancel)
main.add_command(operators.resolve)
main.add_command(operators.migrate)
main.add_command(operators.stuck)
main.add_command(bulk.bulk)
main.add_command(bulk.purge)
main.add_command(held.dlq)
main.add_command(held.parking)
