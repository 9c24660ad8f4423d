"""The ``saga-tasks`` commands the tools add (entry points in ``saga_tasks.commands``).

Each passes its arguments on to the tool's own parser, so ``--help`` is the tool's; the
tool is imported only when its command runs, so listing the commands stays fast.
"""

from __future__ import annotations

import sys

import click

_PASS_THROUGH = {
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "help_option_names": [],
}


@click.command(context_settings=_PASS_THROUGH)
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmark the order saga against bare and durable Celery chains, side by side.

    Options: --sagas N --unloaded N --long N --sweep --json (see --help).
    """
    from tools.bench.cli import main

    sys.exit(main(ctx.args))


@click.command(context_settings=_PASS_THROUGH)
@click.pass_context
def chaos(ctx: click.Context) -> None:
    """Run order sagas under injected faults and random SIGKILLs, then check invariants.

    Options: --sagas N --seconds S --kill-every S --json --here --keep (see --help).
    """
    from tools.chaos.runner import main

    sys.exit(main(ctx.args))


@click.command(context_settings=_PASS_THROUGH)
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Run the demo: workers, beat and Flower, a stream of order sagas, a summary.

    The database migrated and the topology declared first (scripts/demo.sh does both).
    Options: --sagas N --rate R --exit --keep --stop (see --help).
    """
    from tools.demo import main

    sys.exit(main(ctx.args, prog="saga-tasks demo"))
