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


def test_the_broker_comes_from_the_test_variable_then_the_settings(monkeypatch):
    monkeypatch.delenv("SAGA_TEST_BROKER_URL", raising=False)
    monkeypatch.setenv("SAGA_BROKER_URL", "amqps://app:pw@mq.internal:5671/prod;amqps://b/prod")
    iso = Isolation(admin_database_url="postgresql+psycopg2://me@db/postgres", name="n")
    assert (iso.broker_url, iso.broker_from) == (
        "amqps://app:pw@mq.internal:5671/saga_test_n",
        "SAGA_BROKER_URL",
    )
    assert (iso.admin.api, iso.admin.user, iso.admin.password) == (
        "http://mq.internal:15672/api",
        "app",
        "pw",
    )
    monkeypatch.setenv("SAGA_TEST_BROKER_URL", "amqp://tester:t@127.0.0.1:5672//")
    iso = Isolation(admin_database_url="postgresql+psycopg2://me@db/postgres", name="n")
    assert (iso.broker_url, iso.broker_from) == (
        "amqp://tester:t@127.0.0.1:5672/saga_test_n",
        "SAGA_TEST_BROKER_URL",
    )
    assert iso.admin.user == "tester"


def test_the_default_is_guest_on_this_machine(monkeypatch):
    monkeypatch.delenv("SAGA_TEST_BROKER_URL", raising=False)
    monkeypatch.delenv("SAGA_BROKER_URL", raising=False)
    iso = Isolation(admin_database_url="postgresql+psycopg2://me@db/postgres", name="n")
    assert iso.broker_url == "amqp://guest:guest@127.0.0.1:5672/saga_test_n"
    assert (iso.admin.user, iso.admin.password) == ("guest", "guest")
    given = Isolation(admin_database_url="x://", broker_host="u:p@h:1", name="n")
    assert given.broker_url == "amqp://u:p@h:1/saga_test_n" and given.admin.user == "u"
