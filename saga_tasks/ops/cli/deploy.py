"""Checking the services, migrating the schema, declaring the topology, serving the web app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from saga_tasks.ops.cli.base import (
    Context,
    emit,
    errors,
)


@click.command()
@click.pass_obj
def check(obj: Context) -> None:
    """Check that PostgreSQL, RabbitMQ and Redis answer."""
    from saga_tasks.ops import services

    settings = obj.settings
    with errors():
        services.check_all(settings)
    click.echo("PostgreSQL, RabbitMQ and Redis answer")


@click.group()
def db() -> None:
    """The database schema."""


@db.command("upgrade")
@click.option("--create/--no-create", default=True, help="Create each database if it is missing.")
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="TARGET",
    help="Migrate only 'saga' (the orchestrator's database) or the participant of this name "
    "(its own database); repeatable. Default: all of them.",
)
@click.pass_obj
def db_upgrade(obj: Context, create: bool, only: tuple[str, ...]) -> None:
    """Apply every migration: the saga schema's and the app's chains in the orchestrator's
    database, then each participant's chain in its own database (safe to run again, and
    concurrently). Without --app or SAGA_TASKS_APP, the saga schema's only."""
    from saga_tasks.ops import services

    app = obj.app() if obj.app_spec else None
    with errors():
        done = services.upgrade_all(app, obj.settings, only, create=create, say=click.echo)
    for target, chain, revision in done:
        click.echo(f"{chain} at revision {revision}" + ("" if target == "saga" else f" ({target})"))
    if app is None:
        click.echo("no app named (--app or SAGA_TASKS_APP): the saga schema only", err=True)


@db.command("revision")
@click.argument("chain")
@click.option("-m", "--message", required=True, help="What the revision does (its file name).")
@click.option(
    "--autogenerate/--empty",
    default=True,
    help="Write the operations that bring the database to the chain's tables, or an empty "
    "revision to fill in by hand.",
)
@click.pass_obj
def db_revision(obj: Context, chain: str, message: str, autogenerate: bool) -> None:
    """Write the next revision of a chain: a participant's (by its name), or one of the
    app's (by its folder's name), compared against the database it migrates, which must
    be at the chain's head. Numbered after the head (0002 after 0001); nothing in the
    database changes. Read the file, then saga-tasks db upgrade."""
    from saga_tasks.ops import services

    with errors():
        url, location = services.chain_of(obj.app(), chain)
        written = services.revision(url, location, message, autogenerate=autogenerate)
    if written is None:
        click.echo(
            f"nothing to write: the database {chain} migrates matches its tables "
            "(--empty writes a revision to fill in by hand)"
        )
        return
    click.echo(f"wrote {written}")
    click.echo("next: read it, then saga-tasks db upgrade", err=True)


@db.command("current")
@click.option("--only", "only", multiple=True, metavar="TARGET", help="As for db upgrade.")
@click.pass_obj
def db_current(obj: Context, only: tuple[str, ...]) -> None:
    """Print each chain's revision: the saga schema's, the app's, each participant's."""
    from saga_tasks.ops import services

    app = obj.app() if obj.app_spec else None
    with errors():
        for target in services.targets(app, obj.settings, only):
            for chain, revision in services.current_revisions(
                target.url, target.chains, library=target.library
            ):
                click.echo(f"{chain} {revision}")


@click.group()
def broker() -> None:
    """The RabbitMQ topology."""


@broker.command("declare")
@click.option(
    "--create-vhost/--no-create-vhost",
    default=True,
    help="Create SAGA_BROKER_URL's vhost if it is missing (its user needs the "
    "administrator tag, or rabbitmqctl on this host).",
)
@click.pass_obj
def broker_declare(obj: Context, create_vhost: bool) -> None:
    """Declare every exchange and queue (idempotent; reports argument drift)."""
    from saga_tasks.messaging.topology import declare_topology

    app = obj.app()
    url = app.settings.broker_url
    with errors():
        _ensure_vhost(url, create=create_vhost)
        names = declare_topology(url, app.topology)
    click.echo(f"declared {len(names)} queues: {', '.join(names)}")


def _ensure_vhost(url: str, *, create: bool) -> None:
    """Create ``url``'s vhost when RabbitMQ has none of its name and ``create``; else say
    the command that creates it."""
    from saga_tasks.errors import ConfigurationError
    from saga_tasks.messaging.admin import RabbitAdmin, vhost_missing
    from saga_tasks.messaging.users import credentials, management_api, vhost_of

    if not vhost_missing(url):
        return
    vhost = vhost_of(url)
    user, password = credentials(url)
    how = (
        f"rabbitmqctl add_vhost {vhost} && rabbitmqctl set_permissions -p {vhost} "
        f"{user or 'guest'} '.*' '.*' '.*'"
    )
    if not create:
        raise ConfigurationError(f"RabbitMQ has no vhost {vhost!r}; create it: {how}")
    admin = RabbitAdmin(api=management_api(url), user=user or "guest", password=password)
    try:
        admin.create_vhost(vhost)
    except Exception as exc:  # refused, or no API nor rabbitmqctl: say what would do it
        raise ConfigurationError(
            f"RabbitMQ has no vhost {vhost!r} and {user or 'guest'!r} could not create it "
            f"({type(exc).__name__}); create it: {how}"
        ) from exc
    click.echo(f"created vhost {vhost!r}", err=True)


@broker.command("users")
@click.option(
    "--env-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write one env file per service (<service>.env, mode 0600).",
)
@click.option(
    "--api",
    help="Management API URL [default: http://<broker host>:15672/api]; its login "
    "is SAGA_BROKER_URL's.",
)
@click.option("--rotate", is_flag=True, help="Give every user a new password.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def broker_users(obj: Context, env_dir: Path, api: str | None, rotate: bool, as_json: bool) -> None:
    """Create or update one RabbitMQ user per service with the least it needs, and write
    its env file (SAGA_BROKER_URL, SAGA_BROKER_USER_PREFIX). Run with an administrator's
    SAGA_BROKER_URL and SAGA_BROKER_USER_PREFIX set, after `broker declare`. Passwords go
    to the env files only."""
    from saga_tasks.messaging.admin import RabbitAdmin
    from saga_tasks.messaging.users import credentials, management_api
    from saga_tasks.ops.broker_users import provision

    app = obj.app()
    url = app.settings.broker_url
    user, password = credentials(url) if "@" in url else ("guest", "guest")  # AMQP's default
    admin = RabbitAdmin(api=api or management_api(url), user=user, password=password)
    with errors():
        done = provision(
            admin_url=url,
            admin=admin,
            topology=app.topology,
            senders=app.senders,
            env_dir=env_dir,
            rotate=rotate,
        )
    data = {
        "vhost": done[0].vhost if done else None,
        "users": [
            {
                "user": d.grant.user,
                "service": d.grant.service,
                "env_file": str(d.env_file),
                "password": d.password,
                "configure": d.grant.configure,
                "write": d.grant.write,
                "read": d.grant.read,
                "topic_write": dict(d.grant.topic_write),
            }
            for d in done
        ],
    }

    def render(v: dict[str, Any]) -> None:
        click.echo(f"vhost {v['vhost']}")
        for u in v["users"]:
            click.echo(f"{u['user']} ({u['service']}): {u['env_file']}, password {u['password']}")
            for key in ("configure", "write", "read"):
                click.echo(f"  {key:<10} {u[key]}")
            for exchange, keys in u["topic_write"].items():
                click.echo(f"  {'topic':<10} {exchange}: publish with routing keys {keys}")

    emit(data, as_json, render)


@click.group()
def init() -> None:
    """Write the files a new part of an app starts from."""


@init.command("participant")
@click.argument("name")
@click.option(
    "--to",
    "to",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the chain [default: migrations/NAME].",
)
@click.option("--schema", help="Its schema [default: NAME, as Participant(NAME) has].")
@click.option(
    "--module",
    metavar="MODULE:ATTRIBUTE",
    help="The Participant, for autogenerate to compare its tables (e.g. trip.flights:flights).",
)
def init_participant(name: str, to: Path | None, schema: str | None, module: str | None) -> None:
    """A participant's Alembic chain: its environment, and a first revision creating the
    ledger, outbox and redelivery counts in its schema. Add your tables after."""
    from saga_tasks.ops.scaffold import participant_chain

    target = to or Path("migrations") / name
    with errors():
        written = participant_chain(name, target, schema=schema, module=module)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(
        f'next: Participant("{name}", migrations="{target}"), then saga-tasks db upgrade',
        err=True,
    )
