"""A RabbitMQ vhost and a PostgreSQL database of one's own (tests, chaos runs, benchmarks)."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

# -- PostgreSQL -----------------------------------------------------------------------------


def _admin_engine(url: str) -> Any:
    return create_engine(
        make_url(url).set(database="postgres"), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )


def create_database(url: str, template: str | None = None) -> None:
    """Create the database ``url`` names, optionally as a copy of ``template``."""
    name = make_url(url).database
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(text(f'CREATE DATABASE "{name}"{suffix}'))
    finally:
        engine.dispose()


def drop_database(url: str) -> None:
    """Drop the database ``url`` names, closing whatever is still connected to it."""
    name = make_url(url).database
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


def list_databases(url: str, prefix: str) -> list[str]:
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": f"{prefix}%"}
            )
            return [r[0] for r in rows]
    finally:
        engine.dispose()


# -- RabbitMQ -------------------------------------------------------------------------------


@dataclass
class RabbitAdmin:
    """Vhosts and queue counts, through the management API or, without it, ``rabbitmqctl``."""

    api: str = "http://127.0.0.1:15672/api"
    user: str = "guest"
    password: str = "guest"  # noqa: S105 - RabbitMQ's local default account

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method)  # noqa: S310
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            payload = response.read()
        return json.loads(payload) if payload else None

    def available(self) -> bool:
        try:
            self._request("GET", "/overview")
        except (urllib.error.URLError, OSError):
            return False
        return True

    def create_vhost(self, name: str) -> None:
        if self.available():
            self._request("PUT", f"/vhosts/{quote(name, safe='')}")
            self._request(
                "PUT",
                f"/permissions/{quote(name, safe='')}/{self.user}",
                {"configure": ".*", "write": ".*", "read": ".*"},
            )
            return
        subprocess.run(["rabbitmqctl", "add_vhost", name], check=True, capture_output=True)
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", name, self.user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
        )

    def delete_vhost(self, name: str) -> None:
        if self.available():
            with contextlib.suppress(urllib.error.HTTPError):
                self._request("DELETE", f"/vhosts/{quote(name, safe='')}")
            return
        subprocess.run(["rabbitmqctl", "delete_vhost", name], check=False, capture_output=True)

    def vhosts(self, prefix: str) -> list[str]:
        if self.available():
            return [
                v["name"] for v in self._request("GET", "/vhosts") if v["name"].startswith(prefix)
            ]
        out = subprocess.run(
            ["rabbitmqctl", "list_vhosts", "-q"], check=True, capture_output=True, text=True
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip().startswith(prefix)]


def queue_depths(broker_url: str, queues: Sequence[str]) -> dict[str, int]:
    """Ready messages per queue, read with passive declares over AMQP."""
    from kombu import Connection

    depths: dict[str, int] = {}
    with Connection(broker_url) as conn:
        for name in queues:
            channel: Any = conn.channel()
            try:
                _, count, _ = channel.queue_declare(queue=name, passive=True)
                depths[name] = int(count)
            finally:
                channel.close()
    return depths


@dataclass
class Isolation:
    """A vhost and a database of one's own for one test run, and the URLs to reach them."""

    admin_database_url: str = "postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/postgres"
    broker_host: str = "guest:guest@127.0.0.1:5672"
    prefix: str = "saga_test_"
    template: str | None = None
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    rabbit: RabbitAdmin = field(default_factory=RabbitAdmin)

    @property
    def ident(self) -> str:
        return f"{self.prefix}{self.name}"

    @property
    def database_url(self) -> str:
        return str(
            make_url(self.admin_database_url).set(database=self.ident).render_as_string(False)
        )

    @property
    def broker_url(self) -> str:
        return f"amqp://{self.broker_host}/{self.ident}"

    def __enter__(self) -> Isolation:
        self.rabbit.create_vhost(self.ident)
        try:
            create_database(self.database_url, template=self.template)
        except Exception:
            self.rabbit.delete_vhost(self.ident)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            drop_database(self.database_url)
        finally:
            self.rabbit.delete_vhost(self.ident)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that should use this isolation."""
        return {"SAGA_DATABASE_URL": self.database_url, "SAGA_BROKER_URL": self.broker_url, **extra}
