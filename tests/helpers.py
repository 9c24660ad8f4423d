"""What the tests build on: the example deployment on a test's own services, real worker
processes, and reading rows back for assertions. Fixtures live in ``conftest.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from sqlalchemy import text

from saga_tasks.testing import (
    Isolation,
    WorkerProcess,
    drain,
    pump,
    run_command,
    run_reply,
    wait_for,
)

__all__ = [
    "ADMIN_URL",
    "ANA_TOKEN",
    "ORDER",
    "PARTICIPANTS",
    "PREFIX",
    "ServiceUsers",
    "RETRY_TIERS",
    "TIME_SCALE",
    "Workers",
    "build_order_app",
    "demo_faults",
    "assert_each_effect_once",
    "drain",
    "events",
    "forged_reply",
    "held",
    "publish_as",
    "publish_task",
    "reject_one",
    "statuses",
    "to_reserve",
    "participant_db",
    "pump",
    "reserved",
    "reserve_command_id",
    "rows",
    "run_command",
    "run_reply",
    "saga_cli",
    "scalar",
]

ADMIN_URL = os.environ.get(
    "SAGA_TEST_ADMIN_URL", "postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/postgres"
)
RUN = uuid.uuid4().hex[:6]
ANA_TOKEN = "token-of-ana-0123456789"
RETRY_TIERS = "1,2,3"
"""Retry queue delays in tests: the same in this process and in every worker it starts."""
PREFIX = f"saga_t{RUN}_"
SERVICE_MARKERS = ("integration", "e2e", "faults")


def _participants():
    from participants import inventory, orders, payments, returns

    return (orders.participant, inventory.participant, payments.participant, returns.participant)


PARTICIPANTS = _participants()
"""The example's participants, each with its own database in end-to-end tests."""

ORDER = {"customer_id": "c-1", "items": [{"sku": "sku-1", "qty": 2}], "amount_cents": 1999}


def scalar(engine: Any, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def pile_up(app: Any, queue: str, payloads: list[dict], *, first: int = 0) -> list[Any]:
    """Start an order saga per payload (business keys ``b-<first + i>``) and wait until
    ``queue`` holds one more message for each: their consumer is not running yet."""
    from saga_tasks.testing import queue_depths

    url = app.settings.broker_url
    before = queue_depths(url, [queue])[queue]
    handles = [app.start_saga("order", f"b-{first + i}", p) for i, p in enumerate(payloads)]
    wait_for(
        lambda: queue_depths(url, [queue])[queue] >= before + len(payloads),
        timeout=60,
        describe=f"{len(payloads)} more messages waiting in {queue}",
    )
    return handles


def wait_for_lock_waiter(engine: Any, describe: str) -> None:
    """Wait until a session of ``engine``'s database waits for a lock (a batch blocked on
    a row the test holds)."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    wait_for(lambda: scalar(engine, sql) > 0, timeout=60, describe=describe)


def participant_db(app: Any, name: str) -> Any:
    """The engine of participant ``name``'s own database (the orchestrator's, when the
    test keeps every schema in one)."""
    return app.participant_engine(name)


def reserved(app: Any, sku: str = "sku-1") -> int:
    """Units of ``sku`` the inventory participant holds reserved, read in its database."""
    sql = "SELECT reserved FROM inventory.stock WHERE sku = :sku"
    return scalar(participant_db(app, "inventory"), sql, sku=sku)


def rows(engine: Any, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


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
    inspection: float | None = None,
):
    """The example deployment (order and returns sagas, four participants) on this
    test's services."""
    from participants.faults import DemoFaults
    from participants.order_saga import order_saga
    from participants.return_saga import return_saga
    from participants.seed import seed
    from saga_tasks import SagaApp
    from saga_tasks.messaging.topology import declare_topology

    app = SagaApp(
        sagas=[order_saga(time_scale, on_dead_letter), return_saga(time_scale, inspection)],
        participants=list(PARTICIPANTS),
        settings=settings,
        clock=clock,
        hooks=DemoFaults(enabled=faults),
    )
    declare_topology(settings.broker_url, app.topology)
    seed(app.participant_engine)
    return app


TIME_SCALE = 0.03
"""Order saga timeouts in timeout tests: create 0.9 s, authorize 1.8 s, saga 18 s."""


class Workers:
    """Starts real worker processes for one test and stops every one of them after it."""

    def __init__(self, isolation: Isolation, log_dir: Path, *, faults: bool = False) -> None:
        self.isolation = isolation
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []
        self.time_scale = 1.0
        self.faults = faults
        self.extra: dict[str, str] = {}
        """More environment for every process started from now on."""

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
            **{**self.extra, **extra},
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
        own = {}
        if self.isolation.participants and all(q.endswith(".commands") for q in queues):
            # A participant's own process: the orchestrator's database is not even named.
            own = {"SAGA_DATABASE_URL": ""}
        worker = WorkerProcess(
            "participants.app",
            queues=queues,
            name=name,
            pool=pool,
            concurrency=concurrency,
            env={**self.env(), **own, **(env or {})},
            log_dir=self.log_dir,
        )
        self.started.append(worker)
        return worker.start(wait=wait)

    def beat(
        self, name: str = "beat", *, wait: bool = True, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        worker = WorkerProcess(
            "participants.app",
            name=name,
            env={**self.env(), **(env or {})},
            log_dir=self.log_dir,
            role="beat",
        )
        self.started.append(worker)
        return worker.start(wait=wait)

    def orchestrator(self, **kw) -> WorkerProcess:
        return self.start("orchestrator", ["saga.replies", "saga.maintenance"], **kw)

    def participants(self, **kw) -> WorkerProcess:
        return self.start(
            "participants",
            ["orders.commands", "inventory.commands", "payments.commands", "returns.commands"],
            **kw,
        )

    def stop_all(self) -> None:
        try:
            for worker in self.started:
                worker.stop(timeout=10)
        finally:
            # Interrupted (a test's timeout fires while a worker stops): none is left behind.
            for worker in self.started:
                if worker.alive():
                    worker.kill()


def statuses(app) -> dict[str, int]:
    found = rows(app.engine, "SELECT status, count(*) AS n FROM saga.saga_instance GROUP BY status")
    return {r["status"]: r["n"] for r in found}


def assert_each_effect_once(app, sagas: int) -> None:
    engine = app.engine
    assert (
        scalar(
            participant_db(app, "orders"),
            "SELECT count(*) FROM orders.orders WHERE status = 'CONFIRMED'",
        )
        == sagas
    )
    assert (
        scalar(
            participant_db(app, "inventory"),
            "SELECT count(*) FROM inventory.reservation WHERE status = 'RESERVED'",
        )
        == sagas
    )
    assert (
        scalar(
            participant_db(app, "payments"),
            "SELECT count(*) FROM payments.authorization WHERE status = 'AUTHORIZED'",
        )
        == sagas
    )
    assert reserved(app, "sku-1") == 2 * sagas
    # Each step's command ran once per saga: one ledger row per command id.
    for schema, per_saga in (("orders", 2), ("inventory", 1), ("payments", 1)):
        ledger = f"SELECT count(*) FROM {schema}.command_ledger"
        assert scalar(participant_db(app, schema), ledger) == per_saga * sagas
    successes = scalar(
        engine, "SELECT count(*) FROM saga.saga_history WHERE event = 'step_succeeded'"
    )
    assert successes == 4 * sagas, "one transition per step, whatever was redelivered"


def to_reserve(app, url, key):
    handle = app.start_saga("order", key, ORDER)
    run_command(app, drain(url, "orders.commands")[0])
    run_reply(app, drain(url, "saga.replies")[0])
    return handle


def in_review_with_its_reserve_waiting(app, url, key):
    """A saga whose reserve waits for capacity, sent to review by a conflicting reply to
    its create_order (a person must look at it): its waiting row is paused."""
    handle = app.start_saga("order", key, ORDER)
    run_command(app, drain(url, "orders.commands")[0])
    (reply,) = drain(url, "saga.replies")
    run_reply(app, reply)
    conflicting = {**reply, "headers": {**reply["headers"], "id": f"conflict-{key}"},
                   "kwargs": {"outcome": "failure", "error": {"code": "x", "message": ""}}}  # fmt: skip
    run_reply(app, conflicting)
    assert app.orchestrator.get(handle.saga_id).status.value == "MANUAL_REVIEW"
    return handle


def reject_one(url, queue):
    """Take one message off ``queue`` and reject it: the broker dead-letters it."""
    with Connection(url) as conn:
        channel = conn.channel()
        message = channel.basic_get(queue=queue, no_ack=False)
        assert message is not None
        channel.basic_reject(message.delivery_tag, requeue=False)
        channel.close()
    return message


def reject_the_last(url, queue):
    """Dead-letter the last message on ``queue`` and put the ones before it back."""
    with Connection(url) as conn:
        channel = conn.channel()
        taken = []
        while (message := channel.basic_get(queue=queue, no_ack=False)) is not None:
            taken.append(message)
        *others, last = taken
        channel.basic_reject(last.delivery_tag, requeue=False)
        for message in others:
            channel.basic_reject(message.delivery_tag, requeue=True)
        channel.close()
    return last


def lapse(app, clock, saga_id: str) -> None:
    """Move ``clock`` just past the saga's next deadline (an attempt's wait grows with
    its retry policy's backoff, so a fixed step would not do)."""
    wake = app.orchestrator.get(saga_id).next_wake_at()
    assert wake is not None, "nothing is awaited"
    clock.advance(max((wake - clock.now()).total_seconds(), 0) + 1)


def events(app, saga_id):
    return [
        (r["event"], r["actor"])
        for r in rows(
            app.engine,
            "SELECT event, actor FROM saga.saga_history WHERE saga_id = :s ORDER BY id",
            s=saga_id,
        )
    ]


def held(app, holding: str = "dead_letter"):
    """The held messages of one holding, oldest first."""
    return rows(
        app.engine, "SELECT * FROM saga.held_message WHERE holding = :h ORDER BY id", h=holding
    )


# -- one broker user per service --------------------------------------------------------


def saga_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saga_tasks.ops.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class ServiceUsers:
    """The example deployment with one broker user per service, as the deploy step
    (``saga-tasks broker users``, run as an administrator) left it; each user deleted by
    ``close``."""

    SERVICES = ("orchestrator", "orders", "inventory", "payments")

    def __init__(self, isolation: Isolation, settings: Any, env_dir: Path) -> None:
        self.isolation = isolation
        self.admin_settings = settings
        self.prefix = f"{isolation.ident}-"
        self.env_dir = env_dir
        self.apps: list[Any] = []

    def deploy_env(self, **extra: str) -> dict[str, str]:
        base = {
            "SAGA_TASKS_APP": "participants.app:saga_app",
            "SAGA_BROKER_USER_PREFIX": self.prefix,
        }
        return self.isolation.env(**{**base, **extra})

    def users(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return saga_cli(
            "broker", "users", "--env-dir", str(self.env_dir), *extra, env=self.deploy_env()
        )

    def url(self, service: str) -> str:
        for line in (self.env_dir / f"{service}.env").read_text().splitlines():
            if line.startswith("SAGA_BROKER_URL="):
                return line.partition("=")[2]
        raise AssertionError(f"no SAGA_BROKER_URL in {service}.env")

    def user(self, service: str) -> str:
        return f"{self.prefix}{service}"

    def app(self, service: str):
        """The deployment as one service runs it: its own broker user, nothing declared."""
        from participants import inventory, orders, payments
        from participants.order_saga import order_saga
        from saga_tasks import SagaApp, Settings

        settings = Settings.from_env(
            {},
            **{
                **{
                    f: getattr(self.admin_settings, f)
                    for f in ("database_url", "participant_database_url", "retry_tiers")
                },
                "broker_url": self.url(service),
                "broker_user_prefix": self.prefix,
                "poison_limit": 2,
            },
        )
        app = SagaApp(
            sagas=[order_saga()],
            participants=[orders.participant, inventory.participant, payments.participant],
            settings=settings,
        )
        self.apps.append(app)
        return app

    def worker_env(self, service: str) -> dict[str, str]:
        return {"SAGA_BROKER_URL": self.url(service), "SAGA_BROKER_USER_PREFIX": self.prefix}

    def close(self) -> None:
        from saga_tasks import Settings
        from saga_tasks.messaging.celery_config import forget_beat_state
        from saga_tasks.testing import RabbitAdmin

        try:
            for app in self.apps:
                app.close()
            # A beat run as the orchestrator keeps its lease under that user's URL.
            url = self.url("orchestrator")
            db = self.isolation.database_url
            forget_beat_state(Settings.from_env({}, database_url=db, broker_url=url))
        finally:
            admin = RabbitAdmin()
            for user in admin.users(self.prefix):
                admin.delete_user(user)


def publish_as(url: str, exchange: str, routing_key: str, headers: dict, kwargs: dict, **props):
    """A Celery task message published as whoever ``url`` logs in as (confirmed)."""
    body = json.dumps([[], kwargs, {"callbacks": None, "errbacks": None}]).encode()
    with Connection(url) as conn:
        channel = conn.channel()
        channel.confirm_select()
        message = channel.prepare_message(
            body,
            content_type="application/json",
            content_encoding="utf-8",
            headers=headers,
            properties={"delivery_mode": 2, **props},
        )
        channel.basic_publish(message, exchange=exchange, routing_key=routing_key, mandatory=True)
        channel.close()


def publish_task(
    url: str, exchange: str, key: str, task: str, body: list[Any], **headers: Any
) -> str:
    """A protocol 2 task message ``[args, kwargs, embed]`` published as whoever ``url``
    logs in as, signed with that user (``user_id``) and confirmed; its message id."""
    from saga_tasks.messaging.users import broker_user

    message_id = str(uuid.uuid4())
    with Connection(url) as conn:
        channel = conn.channel()
        channel.confirm_select()
        message = channel.prepare_message(
            json.dumps(body).encode(),
            content_type="application/json",
            content_encoding="utf-8",
            headers={"task": task, "id": message_id, **headers},
            properties={"delivery_mode": 2, "user_id": broker_user(url)},
        )
        channel.basic_publish(message, exchange=exchange, routing_key=key, mandatory=True)
        channel.close()
    return message_id


def reserve_command_id(app, saga_id: str) -> str:
    return str(app.orchestrator.get(saga_id).steps["reserve_stock"].command_id)


def forged_reply(saga_id: str, command_id: str):
    """A success for reserve_stock, as only the inventory participant should send it."""
    from saga_tasks.core.messages import Command, reply_message
    from saga_tasks.core.states import MessageKind, Outcome

    command = Command(
        message_id=str(uuid.uuid4()),
        saga_id=saga_id,
        step="reserve_stock",
        kind=MessageKind.COMMAND,
        command_id=command_id,
        attempt=1,
        correlation_id=saga_id,
        payload={},
        results={},
    )
    return reply_message(
        command,
        reply_id=str(uuid.uuid4()),
        reply_queue="saga.replies",
        outcome=Outcome.SUCCESS,
        result={"reservation_id": "forged"},
    )


class WebClients:
    """Web apps over ``order_app``'s sagas and participants with ``settings`` changed (the
    tokens, public reads), each a TestClient; ``close`` closes the apps they were built on."""

    def __init__(self, order_app, settings, tokens: str) -> None:
        self.order_app, self.settings, self.tokens = order_app, settings, tokens
        self.apps: list = []

    def __call__(self, **changes):
        from dataclasses import replace

        from fastapi.testclient import TestClient

        from saga_tasks import SagaApp
        from saga_tasks.web import create_web_app

        app = SagaApp(
            sagas=list(self.order_app.registry),
            participants=list(self.order_app.participants.values()),
            settings=replace(self.settings, api_tokens=self.tokens, **changes),
        )
        self.apps.append(app)
        return TestClient(create_web_app(app))

    def close(self) -> None:
        for app in self.apps:
            app.close()
