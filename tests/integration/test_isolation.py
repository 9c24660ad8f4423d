"""``Isolation()`` against the real services: it makes its database with the role the
environment names, and refuses one it cannot use before it makes anything."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from saga_tasks.errors import ConfigurationError
from saga_tasks.testing import Isolation, RabbitAdmin, list_databases
from tests.helpers import ADMIN_URL, PREFIX


def test_isolation_makes_its_database_as_the_role_the_environment_names(services, monkeypatch):
    monkeypatch.setenv("SAGA_TEST_ADMIN_URL", ADMIN_URL)
    with Isolation(prefix=PREFIX) as iso:
        assert iso.admin_database_url == ADMIN_URL
        assert iso.ident in list_databases(ADMIN_URL, PREFIX)
        assert iso.ident in RabbitAdmin().vhosts(PREFIX)
    assert iso.ident not in list_databases(ADMIN_URL, PREFIX)
    assert iso.ident not in RabbitAdmin().vhosts(PREFIX)


def test_a_role_it_cannot_log_in_as_is_refused_saying_what_it_needs(services, monkeypatch):
    nowhere = make_url(ADMIN_URL).set(port=1, password="s3cret")
    monkeypatch.setenv("SAGA_TEST_ADMIN_URL", nowhere.render_as_string(hide_password=False))
    iso = Isolation(prefix=PREFIX)
    with pytest.raises(ConfigurationError) as refused:
        iso.__enter__()
    message = str(refused.value)
    assert message.startswith("Isolation needs a PostgreSQL role that may create databases")
    assert "cannot log in" in message and "from SAGA_TEST_ADMIN_URL" in message
    assert ":1/postgres" in message and "s3cret" not in message
    assert iso.ident not in RabbitAdmin().vhosts(PREFIX)


def test_a_role_without_createdb_is_refused_saying_what_it_needs(services):
    admin = create_engine(ADMIN_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    role = f"{PREFIX}reader_{uuid.uuid4().hex[:6]}"
    with admin.connect() as conn:
        may = conn.execute(
            text("SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user")
        ).scalar()
        if not may:
            pytest.skip("the admin role may not create the role this test needs")
        conn.execute(text(f"CREATE ROLE \"{role}\" LOGIN NOCREATEDB PASSWORD 'reader'"))
    try:
        url = make_url(ADMIN_URL).set(username=role, password="reader")
        iso = Isolation(admin_database_url=url.render_as_string(hide_password=False))
        with pytest.raises(ConfigurationError) as refused:
            iso.__enter__()
        message = str(refused.value)
        assert f"{role!r} of" in message and f"ALTER ROLE {role} CREATEDB" in message
        assert iso.ident not in list_databases(ADMIN_URL, iso.prefix)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def test_a_broker_user_that_may_not_create_vhosts_is_refused_saying_what_it_needs(
    services, monkeypatch
):
    admin = RabbitAdmin()
    user = f"{PREFIX}nobody_{uuid.uuid4().hex[:6]}"
    admin.put_user(user, "n0body-pw")  # no tags: the management API refuses it
    try:
        monkeypatch.setenv("SAGA_TEST_ADMIN_URL", ADMIN_URL)
        monkeypatch.setenv("SAGA_TEST_BROKER_URL", f"amqp://{user}:n0body-pw@127.0.0.1:5672//")
        iso = Isolation(prefix=PREFIX)
        with pytest.raises(ConfigurationError) as refused:
            iso.__enter__()
        message = str(refused.value)
        assert message.startswith("Isolation needs a RabbitMQ user that may create vhosts")
        assert f"refused {user!r}" in message and "administrator tag" in message
        assert "from SAGA_TEST_BROKER_URL" in message and "n0body-pw" not in message
        assert iso.ident not in list_databases(ADMIN_URL, PREFIX)
        assert iso.ident not in admin.vhosts(PREFIX)
    finally:
        admin.delete_user(user)
