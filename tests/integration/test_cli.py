"""The ``saga-tasks`` command as a user runs it: JSON shapes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ORDER


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saga_tasks.ops.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def env(order_app, isolation):
    return isolation.env(SAGA_TASKS_APP="participants.app:saga_app")


def test_start_show_list_json_shapes(env):
    started = cli(
        "start", "order", "--key", "cli-1", "--payload", json.dumps(ORDER), "--json", env=env
    )
    assert started.returncode == 0, started.stderr
    handle = json.loads(started.stdout)
    assert set(handle) == {"saga_id", "saga_type", "business_key", "status", "created"}
    assert handle["created"] is True

    again = cli(
        "start", "order", "--key", "cli-1", "--payload", json.dumps(ORDER), "--json", env=env
    )
    assert json.loads(again.stdout)["saga_id"] == handle["saga_id"]
    assert json.loads(again.stdout)["created"] is False

    shown = cli("show", handle["saga_id"], "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert {
        "saga_id", "saga_type", "business_key", "status", "status_reason", "version",
        "definition_version", "created_at", "updated_at", "finished_at", "deadline", "steps", "history",
        "history_next", "notes", "held_messages", "held_count",
    } == set(view)  # fmt: skip
    assert view["status"] == "RUNNING" and view["version"] == 1
    assert [s["step"] for s in view["steps"]] == [
        "create_order",
        "reserve_stock",
        "authorize_payment",
        "confirm_order",
    ]
    assert set(view["steps"][0]) == {
        "step", "status", "attempt", "compensation_attempt", "requested_at", "finished_at", "last_error",
    }  # fmt: skip
    assert view["steps"][0]["status"] == "REQUESTED" and view["steps"][0]["attempt"] == 1
    assert [h["event"] for h in view["history"]] == ["step_requested", "saga_started"]
    assert set(view["history"][0]) == {
        "id", "at", "event", "step", "status_before", "status_after", "step_status_before",
        "step_status_after", "message_id", "causation_id", "actor", "reason",
    }  # fmt: skip
    assert (view["history_next"], view["notes"]) == (None, [])
    assert view["held_count"] == {"total": 0, "pending": 0, "not_attested": 0}

    listed = json.loads(
        cli("list", "--status", "running", "--type", "order", "--json", env=env).stdout
    )
    assert listed["count"] == 1 and listed["sagas"][0]["saga_id"] == handle["saga_id"]
    assert json.loads(cli("list", "--status", "COMPLETED", "--json", env=env).stdout)["count"] == 0

    text = cli("show", handle["saga_id"], env=env)
    assert "create_order" in text.stdout and "REQUESTED" in text.stdout


def test_show_pages_the_history_newest_first(env, order_app, settings):
    from tests.helpers import pump, rows

    saga_id = order_app.start_saga("order", "cli-pages", ORDER).saga_id
    pump(order_app, settings.broker_url)
    everything = [
        r["id"]
        for r in rows(
            order_app.engine,
            "SELECT id FROM saga.saga_history WHERE saga_id = :s ORDER BY id DESC",
            s=saga_id,
        )
    ]
    assert len(everything) > 6
    seen, before = [], None
    while True:
        args = ["show", saga_id, "--limit", "3", "--json"]
        page = json.loads(
            cli(*args, *(["--before", str(before)] if before else []), env=env).stdout
        )
        seen += [h["id"] for h in page["history"]]
        assert len(page["history"]) <= 3
        before = page["history_next"]
        if before is None:
            break
    assert seen == everything, "every line once, newest first"
    text = cli("show", saga_id, "--limit", "3", env=env).stdout
    assert "history (newest first)" in text
    assert f"older: saga-tasks show {saga_id} --before {everything[2]}" in text
    last = cli("show", saga_id, "--before", str(everything[-2]), env=env).stdout
    assert "saga_started" in last and "older:" not in last


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("start", "order", "--key", "k", "--payload", "{oops"), "--payload is not valid JSON"),
        (("start", "refund", "--key", "k", "--payload", "{}"), "unknown saga type 'refund'"),
        (("start", "order", "--key", "k", "--payload", '{"items": []}'), "customer_id"),
        (("show", "not-a-uuid"), "is not a saga id"),
        (("show", "00000000-0000-4000-8000-000000000000"), "no saga"),
        (("list", "--status", "DONE"), "unknown status 'DONE'"),
        (("list", "--type", "refund"), "unknown saga type"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(env, args, message):
    result = cli(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


SECRETS = ["hunter2", "c:olon"]
"""Passwords every parser reads the same (``:`` ends the user, not the password)."""
MALFORMED = [
    "Pa/ss#w0rd",
    "qu?ery",
    "at@sign",
    "Spxq Acyq",
    "Sspw@wxyz:rdq",
    "Sab/tcd:xef#ygh?zij@wkl smn",
]
"""Passwords as people write them into URLs, unencoded: ``/``, ``#`` and ``?`` end a
netloc early for libpq, kombu and ``urlsplit``, ``@`` makes the last one the host's for
SQLAlchemy, a space is no URL at all: each parser quotes what it misread."""


def fragments(secret: str) -> list[str]:
    """The password and each piece of it a parser may cut it into."""
    return [secret, *(p for p in re.split(r"[/#?@: ]", secret) if len(p) >= 3)]


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize(
    ("variable", "url", "service"),
    [
        ("SAGA_DATABASE_URL", "postgresql+psycopg2://postgres:{}@127.0.0.1:5999/x", "PostgreSQL"),
        ("SAGA_BROKER_URL", "amqp://guest:{}@127.0.0.1:5999//", "RabbitMQ"),
    ],
)
@pytest.mark.parametrize(
    "command", [["start", "order", "--key", "k", "--payload", "{}"], ["check"]]
)
def test_unreachable_service_is_named_with_its_url_masked(
    env, variable, url, service, secret, command
):
    if command == ["check"] and service == "RabbitMQ":
        env = {**env, "SAGA_DATABASE_URL": env["SAGA_DATABASE_URL"]}  # PostgreSQL answers first
    result = cli(*command, env={**env, variable: url.format(secret)})
    assert result.returncode == 3, result.stderr
    assert f"cannot reach {service} at" in result.stderr
    assert "127.0.0.1:5999" in result.stderr
    output = result.stdout + result.stderr
    assert not [f for f in fragments(secret) if f in output.replace("***", "")]
    assert "***" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("secret", [*SECRETS, *MALFORMED])
@pytest.mark.parametrize(
    ("command", "variable", "url"),
    [
        (["show", "00000000-0000-4000-8000-000000000000"], "SAGA_DATABASE_URL", "postgresql+psycopg2://saga_tasks:{}@127.0.0.1:5999/x"),
        (["list"], "SAGA_DATABASE_URL", "postgresql+psycopg2://saga_tasks:{}@127.0.0.1:5999/x"),
        (["db", "upgrade"], "SAGA_DATABASE_URL", "postgresql+psycopg2://saga_tasks:{}@127.0.0.1:5999/x"),
        (["check"], "SAGA_DATABASE_URL", "postgresql+psycopg2://saga_tasks:{}@127.0.0.1:5999/x"),
        (["check"], "SAGA_BROKER_URL", "amqp://guest:{}@127.0.0.1:5999//"),
        (["check"], "SAGA_RESULT_BACKEND", "redis://:{}@127.0.0.1:5999/0"),
        (["broker", "declare"], "SAGA_BROKER_URL", "amqp://guest:{}@127.0.0.1:5999//"),
    ],
)  # fmt: skip
def test_no_piece_of_a_password_shows_however_the_url_is_written(
    env, command, variable, url, secret
):
    """Malformed (a raw / # ? @ or space in the password): one line saying so, exit 1,
    the whole of the credentials masked, before any driver misreads it. Well-formed: the
    service is named with the password masked, exit 3. Never a traceback or a piece."""
    if variable != "SAGA_DATABASE_URL" and command == ["check"]:
        env = {**env, "SAGA_DATABASE_URL": env["SAGA_DATABASE_URL"]}  # PostgreSQL answers first
    result = cli(*command, env={**env, variable: url.format(secret)})
    output = result.stdout + result.stderr
    assert "Traceback" not in output and result.stderr.count("\n") == 1, output
    assert not [f for f in fragments(secret) if f in output.replace("***", "")], output
    scheme, _, rest = url.partition("://")
    at = rest.rfind("@")
    if secret in MALFORMED:
        assert result.returncode == 1, output
        assert f"{variable} is malformed: " in result.stderr
        assert result.stderr.rstrip().endswith(f"{scheme}://***@{rest[at + 1 :]}")
    else:
        assert result.returncode == 3, output
        assert f"{scheme}://{rest[:at].partition(':')[0]}:***@127.0.0.1:5999" in result.stderr


@pytest.mark.parametrize("secret", [*SECRETS, *MALFORMED])
@pytest.mark.parametrize(
    "value",
    [
        "postgresql+psycopg2://bob:{}@127.0.0.1:5999/{{participant}}",
        "inventory=postgresql+psycopg2://bob:{}@127.0.0.1:5999/inv",
    ],
)
def test_an_unreachable_participant_database_is_named_with_its_url_masked(env, value, secret):
    url = value.format(secret)
    result = cli(
        "db", "upgrade", "--only", "inventory", env={**env, "SAGA_PARTICIPANT_DATABASE_URL": url}
    )
    output = result.stdout + result.stderr
    assert not [f for f in fragments(secret) if f in output.replace("***", "")], output
    assert "Traceback" not in output and result.stderr.count("\n") == 1, output
    if secret in SECRETS:
        assert result.returncode == 3, result.stderr
        assert (
            "cannot reach PostgreSQL at postgresql+psycopg2://bob:***@127.0.0.1:5999/"
            in result.stderr
        )
    else:
        assert result.returncode == 1, result.stderr
        assert "SAGA_PARTICIPANT_DATABASE_URL" in result.stderr
    broken = cli("db", "upgrade", env={**env, "SAGA_PARTICIPANT_DATABASE_URL": f"{url} nonsense"})
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1
    assert not [f for f in fragments(secret) if f in broken.stdout + broken.stderr]


@pytest.mark.parametrize("value", ["nonsense", "postgresql:/x", "://nothing"])
def test_a_database_url_that_does_not_parse_is_one_line_and_exit_1(env, value):
    result = cli("db", "current", env={**env, "SAGA_DATABASE_URL": value})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "SAGA_DATABASE_URL is not a URL" in result.stderr


def test_check_names_redis_when_it_is_away(env):
    result = cli("check", env={**env, "SAGA_RESULT_BACKEND": "redis://:pw@127.0.0.1:5999/0"})
    assert result.returncode == 3
    assert "cannot reach Redis at redis://:***@127.0.0.1:5999/0" in result.stderr
    assert cli("check", env=env).returncode == 0


def test_check_says_what_creates_a_database_that_does_not_exist(env):
    from sqlalchemy.engine import make_url

    missing = make_url(env["SAGA_DATABASE_URL"]).set(database="saga_never_made_db")
    url = missing.render_as_string(hide_password=False)
    result = cli("check", env={**env, "SAGA_DATABASE_URL": url})
    assert result.returncode == 3 and result.stderr.count("\n") == 1, result.stderr
    assert 'database "saga_never_made_db" does not exist' in result.stderr
    assert result.stderr.rstrip().endswith("(saga-tasks db upgrade creates it)")


def test_the_examples_seed_fills_in_what_is_missing_and_leaves_the_rest(isolation):
    from click.testing import CliRunner
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from participants.seed import seed_command
    from tests.helpers import scalar

    runner = CliRunner()
    env = isolation.env()
    first = runner.invoke(seed_command, [], env=env)
    assert (first.exit_code, first.output) == (
        0,
        "stocked 12 new SKUs, opened 21 new customers\n",
    )
    engine = create_engine(isolation.database_url, poolclass=NullPool)
    with engine.begin() as conn:  # an order holds stock
        conn.execute(text("UPDATE inventory.stock SET reserved = 2 WHERE sku = 'sku-1'"))
    again = runner.invoke(seed_command, [], env=env)
    assert again.output == "stocked 0 new SKUs, opened 0 new customers\n"
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 2
    reset = runner.invoke(seed_command, ["--reset"], env=env)
    assert reset.output == "set 12 SKUs and 21 customers to the demo's values\n"
    assert scalar(engine, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 0
    engine.dispose()


def test_text_from_outside_is_escaped_on_the_terminal(env):
    key = "k\x1b]0;owned\x07\nFAKE saga line"
    started = cli("start", "order", "--key", key, "--payload", json.dumps(ORDER), "--json", env=env)
    assert started.returncode == 0, started.stderr
    saga_id = json.loads(started.stdout)["saga_id"]
    for args in (["list"], ["show", saga_id]):
        shown = cli(*args, env=env)
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
        assert "\\x1b]0;owned\\x07\\nFAKE saga line" in shown.stdout
        assert not any(line.startswith("FAKE") for line in shown.stdout.splitlines())
    as_json = cli("list", "--json", env=env)
    assert json.loads(as_json.stdout)["sagas"][0]["business_key"] == key


def test_read_commands_load_none_of_the_deployment(env, order_app):
    """``show``, ``list`` and ``stuck`` read the saga tables only: with SAGA_DATABASE_URL
    set they import neither the app's module nor Celery, kombu, the web stack or
    SQLAlchemy (most of such a command's wall time), and say the same as through the app
    (``--app``)."""
    saga_id = order_app.start_saga("order", "light-1", ORDER).saga_id
    probe = (
        "import sys\n"
        "from saga_tasks.ops.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "heavy = sorted(m for m in ('celery', 'kombu', 'participants', 'fastapi', 'redis',\n"
        "                           'sqlalchemy') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    for args in (["show", saga_id, "--json"], ["list", "--json"], ["stuck", "--json"]):
        light = subprocess.run(
            [sys.executable, "-c", probe, *args],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert light.returncode == 0, light.stderr
        assert "HEAVY []" in light.stderr, (args, light.stderr)
        full = cli("--app", "participants.app:saga_app", *args, env=env)
        assert full.returncode == 0, full.stderr
        assert json.loads(light.stdout) == json.loads(full.stdout), args


def test_broker_declare_creates_a_missing_vhost_or_names_the_command(env, isolation):
    """``broker declare`` on a vhost nobody had created failed with the broker's 530 and no
    hint (a step the README did not name): it creates the vhost when its user may, and
    with --no-create-vhost says the command that would."""
    from saga_tasks.testing import RabbitAdmin

    vhost = f"{isolation.ident}_new"  # the prefix: a run that dies leaves it to the sweep
    url = isolation.broker_url.rsplit("/", 1)[0] + f"/{vhost}"
    try:
        refused = cli("broker", "declare", "--no-create-vhost", env={**env, "SAGA_BROKER_URL": url})
        assert refused.returncode == 1, refused.stderr
        assert f"rabbitmqctl add_vhost {vhost}" in refused.stderr
        assert vhost not in RabbitAdmin().vhosts(vhost)
        declared = cli("broker", "declare", env={**env, "SAGA_BROKER_URL": url})
        assert declared.returncode == 0, declared.stderr
        assert f"created vhost {vhost!r}" in declared.stderr
        assert declared.stdout.startswith("declared ")
        again = cli("broker", "declare", env={**env, "SAGA_BROKER_URL": url})
        assert again.returncode == 0 and "created vhost" not in again.stderr
    finally:
        RabbitAdmin().delete_vhost(vhost)
