"""Which role ``Isolation`` creates its databases as, and its refusal of one that may not:
``Isolation()`` takes what the user has, or says what it needs, before it makes anything."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from saga_tasks.config import Settings
from saga_tasks.errors import ConfigurationError
from saga_tasks.ops import isolation
from saga_tasks.ops.isolation import Isolation, admin_url


def test_the_test_variable_comes_first():
    env = {
        "SAGA_TEST_ADMIN_URL": "postgresql+psycopg2://admin:pw@db/postgres",
        "SAGA_DATABASE_URL": "postgresql+psycopg2://app:pw@db/app",
    }
    assert admin_url(env) == ("postgresql+psycopg2://admin:pw@db/postgres", "SAGA_TEST_ADMIN_URL")


def test_else_the_settings_database_url_on_its_servers_postgres_database():
    env = {"SAGA_DATABASE_URL": "postgresql+psycopg2://app:s3cret@db:5433/app"}
    assert admin_url(env) == (
        "postgresql+psycopg2://app:s3cret@db:5433/postgres",
        "SAGA_DATABASE_URL",
    )
    default = make_url(Settings().database_url).set(database="postgres")
    assert admin_url({}) == (default.render_as_string(hide_password=False), "SAGA_DATABASE_URL")


def test_isolation_reads_the_environment_when_built(monkeypatch):
    monkeypatch.setenv("SAGA_TEST_ADMIN_URL", "postgresql+psycopg2://admin:pw@db/postgres")
    iso = Isolation(prefix="p_", name="n")
    assert iso.admin_database_url == "postgresql+psycopg2://admin:pw@db/postgres"
    assert iso.database_url == "postgresql+psycopg2://admin:pw@db/p_n"
    given = Isolation(admin_database_url="postgresql+psycopg2://me@db/postgres")
    assert given.admin_database_url == "postgresql+psycopg2://me@db/postgres"


class _Rabbit:
    def __init__(self) -> None:
        self.made: list[str] = []

    def create_vhost(self, name: str) -> None:
        self.made.append(name)


def test_a_role_that_may_not_create_databases_is_refused_before_anything_is_made(monkeypatch):
    monkeypatch.setattr(isolation, "creator", lambda url: ("reader", False))
    rabbit = _Rabbit()
    iso = Isolation(admin_database_url="postgresql+psycopg2://reader:pw@db/postgres", rabbit=rabbit)
    with pytest.raises(ConfigurationError) as refused:
        iso.__enter__()
    message = str(refused.value)
    assert "may create databases" in message and "ALTER ROLE reader CREATEDB" in message
    assert "SAGA_TEST_ADMIN_URL" in message and "reader:***@db" in message
    assert "pw" not in message.replace("***", "")
    assert rabbit.made == []
