"""Fixtures: a vhost and a database of its own for every test that touches the services
(what they build on is in ``tests/helpers.py``).

The schema is migrated once into a template database; each test's database is a
copy of it (``CREATE DATABASE ... TEMPLATE``), which takes milliseconds. Everything
a run creates carries the run's prefix and is removed at the end of the session,
also when a test failed half-way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from saga_tasks.testing import (
    Isolation,
    RabbitAdmin,
    create_database,
    drop_database,
    list_databases,
)
from tests.helpers import (
    ADMIN_URL,
    ANA_TOKEN,
    PARTICIPANTS,
    PREFIX,
    RETRY_TIERS,
    SERVICE_MARKERS,
    TIME_SCALE,
    ServiceUsers,
    Workers,
    build_order_app,
    demo_faults,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in SERVICE_MARKERS:
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def services() -> None:
    """Fail fast, with the URL, when PostgreSQL or RabbitMQ is not there."""
    from saga_tasks.ops.services import check_broker
    from saga_tasks.persistence.db import check_database

    check_database(ADMIN_URL)
    check_broker("amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture(scope="session")
def template_database(services: None) -> Iterator[str]:
    from sqlalchemy.engine import make_url

    from saga_tasks.ops.services import upgrade

    def url_of(database: str) -> str:
        return make_url(ADMIN_URL).set(database=database).render_as_string(False)

    name = f"{PREFIX}template"
    # One database holding the saga schema and every participant's (SAGA_PARTICIPANT_
    # DATABASE_URL empty); for deployments apart, one holding the saga schema alone and
    # one per participant holding its schema alone.
    create_database(url_of(name))
    upgrade(url_of(name), [str(p.migrations) for p in PARTICIPANTS])
    create_database(url_of(f"{name}_apart"))
    upgrade(url_of(f"{name}_apart"))
    for p in PARTICIPANTS:
        create_database(url_of(f"{name}_apart_{p.name}"))
        upgrade(url_of(f"{name}_apart_{p.name}"), [str(p.migrations)], library=False)
    from saga_tasks.persistence.db import dispose_all

    dispose_all()
    yield name
    for database in (name, f"{name}_apart", *(f"{name}_apart_{p.name}" for p in PARTICIPANTS)):
        drop_database(url_of(database))
    # Anything left by a test that died before its own teardown.
    for leftover in list_databases(ADMIN_URL, PREFIX):
        drop_database(make_url(ADMIN_URL).set(database=leftover).render_as_string(False))
    admin = RabbitAdmin()
    for vhost in admin.vhosts(PREFIX):
        admin.delete_vhost(vhost)
    for user in admin.users(PREFIX):  # made by `broker users` in a test that died half-way
        admin.delete_user(user)


@pytest.fixture
def isolation(template_database: str, request: pytest.FixtureRequest) -> Iterator[Isolation]:
    """End-to-end and fault tests run the example as it deploys: a database per
    participant; the other service tests keep every schema in one database (a mode
    the library supports too)."""
    apart = any(request.node.get_closest_marker(m) for m in ("e2e", "faults"))
    with Isolation(
        admin_database_url=ADMIN_URL,
        prefix=PREFIX,
        template=f"{template_database}_apart" if apart else template_database,
        participants=tuple(p.name for p in PARTICIPANTS) if apart else (),
    ) as iso:
        yield iso
        from saga_tasks.persistence.db import dispose_all

        dispose_all()


@pytest.fixture
def settings(isolation: Isolation):
    from saga_tasks import Settings

    return Settings.from_env(
        {},
        database_url=isolation.database_url,
        participant_database_url=isolation.participant_database_url,
        broker_url=isolation.broker_url,
        relay_interval=0.5,
        relay_min_age=1.0,
        retry_tiers=RETRY_TIERS,
        poison_limit=2,
        intake_interval=0.5,
        api_tokens=f"ana:{ANA_TOKEN}",
    )


@pytest.fixture
def order_app(settings, request):
    app = build_order_app(settings, faults=demo_faults(request))
    yield app
    app.close()


@pytest.fixture
def clock():
    from datetime import UTC, datetime

    from saga_tasks.testing import FakeClock

    return FakeClock(datetime.now(UTC))


@pytest.fixture
def clocked_app(settings, clock, request):
    """The order saga with a clock the test moves (timeouts: create 30 s, authorize 60 s)."""
    app = build_order_app(settings, clock=clock, faults=demo_faults(request))
    yield app
    app.close()


@pytest.fixture
def fast_app(settings, workers, request):
    """The order saga with short timeouts, in this process and in the workers it starts."""
    workers.time_scale = TIME_SCALE
    app = build_order_app(settings, time_scale=TIME_SCALE, faults=demo_faults(request))
    yield app
    app.close()


@pytest.fixture
def service_users(order_app, settings, isolation, tmp_path) -> Iterator[ServiceUsers]:
    """One broker user per service: the topology declared as an administrator (by
    ``order_app``), then ``saga-tasks broker users``; the users deleted after the test."""
    found = ServiceUsers(isolation, settings, tmp_path / "env")
    try:
        made = found.users("--json")
        assert made.returncode == 0, made.stderr
        yield found
    finally:
        found.close()


@pytest.fixture
def workers(
    isolation: Isolation, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Workers]:
    pool = Workers(isolation, tmp_path / "logs", faults=demo_faults(request))
    yield pool
    pool.stop_all()
    from saga_tasks import Settings
    from saga_tasks.messaging.celery_config import forget_beat_state

    forget_beat_state(
        Settings.from_env({}, database_url=isolation.database_url, broker_url=isolation.broker_url)
    )
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in pool.started:
            print(f"\n----- {worker.name} log (tail) -----\n{worker.tail(60)}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
