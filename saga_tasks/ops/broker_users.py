"""The deploy step that gives each service its own RabbitMQ user (``saga-tasks broker
users``): created or updated with the least it needs (``messaging.users``), and one env
file per service holding its broker URL.

Run with an administrator's broker URL, after ``broker declare``. Safe to run again: a
user keeps the password its env file holds. A new user gets a random one. A user that
exists while its env file is missing (or names another user) is refused unless
``rotate``: its password cannot be read back from the broker, and a new one would cut
off every service still using the old one. Passwords go to the env files (mode 0600)
and nowhere else: not to the output, not to a log.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from saga_tasks.core.senders import Senders
from saga_tasks.errors import ConfigurationError
from saga_tasks.messaging.admin import RabbitAdmin
from saga_tasks.messaging.topology import Topology
from saga_tasks.messaging.users import Grant, credentials, grants, service_url, vhost_of
from saga_tasks.urls import mask_url

URL_KEY = "SAGA_BROKER_URL"
PREFIX_KEY = "SAGA_BROKER_USER_PREFIX"


@dataclass(frozen=True)
class ServiceUser:
    """One user as the step left it."""

    grant: Grant
    vhost: str
    env_file: Path
    password: str
    """Where its password came from: ``kept`` (its env file), ``new`` or ``rotated``;
    never the password itself."""


def env_file(env_dir: Path, grant: Grant) -> Path:
    return env_dir / f"{grant.service}.env"


def read_env(env_dir: Path, service: str) -> dict[str, str]:
    """The settings ``service``'s env file holds (``KEY=value`` lines)."""
    path = env_dir / f"{service}.env"
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigurationError(
            f"no env file for {service} in {env_dir} (run saga-tasks broker users): {exc}"
        ) from exc
    found = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            found[key.strip()] = value.strip()
    return found


def provision(
    *,
    admin_url: str,
    admin: RabbitAdmin,
    topology: Topology,
    senders: Senders,
    env_dir: Path,
    rotate: bool = False,
) -> list[ServiceUser]:
    """Create or update every service user on ``admin_url``'s vhost; write its env file."""
    if not senders.enforced:
        raise ConfigurationError(
            f"{PREFIX_KEY} is empty: every process shares one broker user; set it (e.g. "
            "saga-) to give each service its own"
        )
    try:
        vhost = vhost_of(admin_url)
    except ValueError as exc:
        raise ConfigurationError(f"SAGA_BROKER_URL cannot be read: {mask_url(admin_url)}") from exc
    wanted = grants(topology, senders)
    env_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    done = []
    for grant in wanted:
        path = env_file(env_dir, grant)
        known = _password_in(path, grant.user)
        if known is not None and not rotate:
            password, how = known, "kept"
        elif admin.user_exists(grant.user) and not rotate:
            raise ConfigurationError(
                f"broker user {grant.user!r} exists but {path} does not hold its password; "
                "run again with --rotate to give it a new one (every service still using "
                "the old one must restart with the new env file)"
            )
        else:
            password, how = secrets.token_urlsafe(24), "rotated" if known else "new"
        # The file first: should the broker then fail, the next run reads the password back.
        _write_env(path, service_url(admin_url, grant.user, password), senders.prefix)
        admin.put_user(grant.user, password)
        for exchange, keys in grant.topic_write:
            admin.set_topic_permissions(vhost, grant.user, exchange=exchange, write=keys, read="^$")
        admin.set_permissions(
            vhost, grant.user, configure=grant.configure, write=grant.write, read=grant.read
        )
        done.append(ServiceUser(grant, vhost, path, how))
    return done


def remove(admin: RabbitAdmin, users: Sequence[str]) -> None:
    """Delete the users (and with them their permissions on every vhost)."""
    for user in users:
        admin.delete_user(user)


def _password_in(path: Path, user: str) -> str | None:
    """The password an env file holds for ``user``; None if none does."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == URL_KEY:
            found_user, password = credentials(value.strip())
            return password if found_user == user and password else None
    return None


def _write_env(path: Path, url: str, prefix: str) -> None:
    """Write the env file whole or not at all, readable by its owner only."""
    text = (
        "# RabbitMQ credentials of one service (saga-tasks broker users). Keep it secret.\n"
        f"{URL_KEY}={url}\n{PREFIX_KEY}={prefix}\n"
    )
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    partial.replace(path)


__all__ = ["ServiceUser", "env_file", "provision", "remove"]
