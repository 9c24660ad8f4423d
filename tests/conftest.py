"""Fixtures: a vhost and a database of its own for every test that touches the services.

The schema is migrated once into a template database; each test's database is a
copy of it (``CREATE DATABASE ... TEMPLATE``), which takes milliseconds. Everything
a run creates carries the run's prefix and is removed at the end of the session,
also when a test failed half-way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga_tasks.testing import (
    Isolation,
    RabbitAdmin,
    WorkerProcess,
    create_database,
    drop_database,
    list_databases,
)

ADMIN_URL = os.environ.get(
    "SAGA_TEST_ADMIN_URL", "postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/postgres"
)
RUN = uuid.uuid4().hex[:6]
ANA_TOKEN = "token-of-ana-0123456789"
RETRY_TIERS = "1,2,3"
"""Retry queue delays in tests: the same in this process and in every worker it starts."""
PREFIX = f"saga_t{RUN}_"
SERVICE_MARKERS = ("integration", "e2e", "faults")


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

    from participants import MIGRATIONS
    from saga_tasks.ops.services import upgrade

    name = f"{PREFIX}template"
    url = make_url(ADMIN_URL).set(database=name).render_as_string(False)
    create_database(url)
    upgrade(url, [MIGRATIONS])  # the saga schema, then the example's
    from saga_tasks.persistence.db import dispose_all

    dispose_all()
    yield name
    drop_database(url)
    # Anything left by a test that died before its own teardown.
    for leftover in list_databases(ADMIN_URL, PREFIX):
        drop_database(make_url(ADMIN_URL).set(database=leftover).render_as_string(False))
    admin = RabbitAdmin()
    for vhost in admin.vhosts(PREFIX):
        admin.delete_vhost(vhost)


@pytest.fixture
def isolation(template_database: str) -> Iterator[Isolation]:
    with Isolation(admin_database_url=ADMIN_URL, prefix=PREFIX, template=template_database) as iso:
        yield iso
        from saga_tasks.persistence.db import dispose_all

        dispose_all()


@pytest.fixture
def settings(isolation: Isolation):
    from saga_tasks import Settings

    return Settings.from_env(
        {},
        database_url=isolation.database_url,
        broker_url=isolation.broker_url,
        relay_interval=0.5,
        relay_min_age=1.0,
        retry_tiers=RETRY_TIERS,
        poison_limit=2,
        intake_interval=0.5,
        api_tokens=f"ana:{ANA_TOKEN}",
    )


def demo_faults(request: pytest.FixtureRequest) -> bool:
    """A test marked ``demo_faults`` lets payloads inject faults; every other test runs the
    production path (the example's hooks installed, faults refused)."""
    return request.node.get_closest_marker("demo_faults") is not None


def build_order_app(
    settings,
    *,
    clock=None,
    time_scale: float = 1.0,
    on_dead_letter="compensate",
    faults: bool = False,
):
    """The example deployment (order saga, three participants) on this test's services."""
    from participants import inventory, orders, payments
    from participants.faults import DemoFaults
    from participants.order_saga import order_saga
    from participants.seed import seed
    from saga_tasks import SagaApp
    from saga_tasks.messaging.topology import declare_topology

    app = SagaApp(
        sagas=[order_saga(time_scale, on_dead_letter)],
        participants=[orders.participant, inventory.participant, payments.participant],
        settings=settings,
        clock=clock,
        hooks=DemoFaults(enabled=faults),
    )
    declare_topology(settings.broker_url, app.topology)
    seed(app.engine)
    return app


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


TIME_SCALE = 0.03
"""Order saga timeouts in timeout tests: create 0.9 s, authorize 1.8 s, saga 18 s."""


@pytest.fixture
def fast_app(settings, workers, request):
    """The order saga with short timeouts, in this process and in the workers it starts."""
    workers.time_scale = TIME_SCALE
    app = build_order_app(settings, time_scale=TIME_SCALE, faults=demo_faults(request))
    yield app
    app.close()


class Workers:
    """Starts real worker processes for one test and stops every one of them after it."""

    def __init__(self, isolation: Isolation, log_dir: Path, *, faults: bool = False) -> None:
        self.isolation = isolation
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []
        self.time_scale = 1.0
        self.faults = faults

    def env(self, **extra: str) -> dict[str, str]:
        return self.isolation.env(
            SAGA_TASKS_DEMO_FAULTS="1" if self.faults else "0",
            SAGA_RELAY_INTERVAL="0.5",
            SAGA_RELAY_MIN_AGE="1",
            SAGA_SWEEP_INTERVAL="0.3",
            SAGA_RETRY_TIERS=RETRY_TIERS,
            SAGA_POISON_LIMIT="2",
            SAGA_INTAKE_INTERVAL="0.5",
            SAGA_BEAT_LOCK_TIMEOUT="3",
            ORDER_SAGA_TIME_SCALE=str(self.time_scale),
            SAGA_TASKS_APP="participants.app:saga_app",
            PYTHONPATH=str(Path(__file__).resolve().parents[1]),
            **extra,
        )

    def start(
        self,
        name: str,
        queues: list[str],
        *,
        pool: str = "solo",
        concurrency: int = 1,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        worker = WorkerProcess(
            "participants.app",
            queues=queues,
            name=name,
            pool=pool,
            concurrency=concurrency,
            env={**self.env(), **(env or {})},
            log_dir=self.log_dir,
        )
        self.started.append(worker)
        return worker.start(wait=wait)

    def beat(self, name: str = "beat") -> WorkerProcess:
        worker = WorkerProcess(
            "participants.app", name=name, env=self.env(), log_dir=self.log_dir, role="beat"
        )
        self.started.append(worker)
        return worker.start()

    def orchestrator(self, **kw) -> WorkerProcess:
        return self.start("orchestrator", ["saga.replies", "saga.maintenance"], **kw)

    def participants(self, **kw) -> WorkerProcess:
        return self.start(
            "participants", ["orders.commands", "inventory.commands", "payments.commands"], **kw
        )

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop(timeout=10)


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
