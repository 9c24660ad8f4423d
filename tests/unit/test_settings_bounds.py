"""Settings that would pass as numbers but silently switch a guarantee off are refused at
start, with the setting and its bound in the message."""

from __future__ import annotations

import pytest

from saga_tasks.config import Settings
from saga_tasks.errors import ConfigurationError

FLOAT_SETTINGS = [
    "SAGA_RELAY_INTERVAL",
    "SAGA_RELAY_MIN_AGE",
    "SAGA_SWEEP_INTERVAL",
    "SAGA_BEAT_LOCK_TIMEOUT",
    "SAGA_INTAKE_INTERVAL",
    "SAGA_STUCK_AFTER",
    "SAGA_REPLAY_MAX_AGE",
    "SAGA_ALERT_INTERVAL",
    "SAGA_SAMPLE_INTERVAL",
    "SAGA_SAMPLE_KEEP",
    "SAGA_PUBLISH_TIMEOUT",
    "SAGA_MARK_INTERVAL",
]


@pytest.mark.parametrize("variable", ["SAGA_SWEEP_BATCH", "SAGA_RELAY_BATCH"])
@pytest.mark.parametrize("value", ["0", "-1", "-500"])
def test_batches_below_one_are_refused(variable, value):
    # 0: the sweep or the recovery claims nothing, so timeouts or recovery never happen;
    # a negative LIMIT is an SQL error on every pass.
    with pytest.raises(ConfigurationError, match=rf"{variable}={value} .*at least 1"):
        Settings.from_env({variable: value})


@pytest.mark.parametrize("variable", ["SAGA_SWEEP_BATCH", "SAGA_RELAY_BATCH"])
def test_a_batch_of_one_is_accepted(variable):
    Settings.from_env({variable: "1"})


@pytest.mark.parametrize(
    ("env", "longest_sleep", "bound"),
    [
        # Defaults: beat sleeps at most min(sweep, relay) = 2 s between lease renewals.
        ({}, 2.0, 6),
        # Sub-second intervals: beat still sleeps up to 1 s (its loop's floor).
        ({"SAGA_SWEEP_INTERVAL": "0.3", "SAGA_RELAY_INTERVAL": "0.5"}, 1.0, 3),
        ({"SAGA_SWEEP_INTERVAL": "5", "SAGA_RELAY_INTERVAL": "4"}, 4.0, 12),
        ({"SAGA_SWEEP_INTERVAL": "1.5", "SAGA_RELAY_INTERVAL": "30"}, 1.5, 5),
    ],
)
def test_beat_lease_must_outlast_beats_longest_sleep(env, longest_sleep, bound):
    for below in {longest_sleep / 2, longest_sleep, bound - 1.0, bound - 0.5}:
        # At or below the sleep, the lease lapses while beat sleeps and redbeat's next
        # extend raises LockNotOwnedError; just above it, one slow tick does the same.
        with pytest.raises(ConfigurationError) as refused:
            Settings.from_env({**env, "SAGA_BEAT_LOCK_TIMEOUT": str(below)})
        message = str(refused.value)
        assert f"SAGA_BEAT_LOCK_TIMEOUT={below}" in message
        assert f"at least {bound} s" in message
        assert "SAGA_SWEEP_INTERVAL" in message and "SAGA_RELAY_INTERVAL" in message
    ok = Settings.from_env({**env, "SAGA_BEAT_LOCK_TIMEOUT": str(bound)})
    assert ok.beat_max_interval == longest_sleep
    assert ok.beat_lease == bound


def test_a_slower_sweep_needs_a_longer_lease():
    # The default lease is fine for the default intervals, not for a 10 s sweep and relay.
    with pytest.raises(ConfigurationError, match=r"SAGA_BEAT_LOCK_TIMEOUT=10.0 .*at least 30 s"):
        Settings.from_env({"SAGA_SWEEP_INTERVAL": "10", "SAGA_RELAY_INTERVAL": "10"})


def test_the_celery_app_uses_the_lease_and_sleep_the_bound_was_checked_against():
    from saga_tasks import SagaApp

    settings = Settings.from_env(
        {"SAGA_SWEEP_INTERVAL": "4", "SAGA_RELAY_INTERVAL": "7", "SAGA_BEAT_LOCK_TIMEOUT": "12.9"}
    )
    conf = SagaApp(sagas=[], settings=settings).celery.conf
    assert conf.beat_max_loop_interval == settings.beat_max_interval == 4.0
    assert conf.redbeat_lock_timeout == settings.beat_lease == 12
    assert conf.redbeat_lock_timeout >= 3 * conf.beat_max_loop_interval


@pytest.mark.parametrize("variable", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_non_finite_seconds_are_refused(variable, value):
    # nan passes every "<= 0" check, and an infinite interval or age means "never".
    with pytest.raises(ConfigurationError, match=rf"{variable}.*finite"):
        Settings.from_env({variable: value})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # SQLAlchemy reads a pool size of 0 as "no limit", and -1 overflow as unbounded.
        ({"SAGA_DB_POOL_SIZE": "0"}, r"SAGA_DB_POOL_SIZE=0 .*at least 1"),
        ({"SAGA_DB_POOL_SIZE": "-2"}, r"SAGA_DB_POOL_SIZE=-2 .*at least 1"),
        # Celery reads a prefetch multiplier of 0 as "unlimited": no flow control.
        ({"SAGA_PREFETCH_MULTIPLIER": "0"}, r"SAGA_PREFETCH_MULTIPLIER=0 .*at least 1"),
        ({"SAGA_PREFETCH_MULTIPLIER": "-1"}, r"SAGA_PREFETCH_MULTIPLIER=-1 .*at least 1"),
        # The metrics server would fail in a signal handler, after the worker started.
        ({"SAGA_METRICS_PORT": "-1"}, r"SAGA_METRICS_PORT=-1 .*0 to 65535"),
        ({"SAGA_METRICS_PORT": "70000"}, r"SAGA_METRICS_PORT=70000 .*0 to 65535"),
        # Samples pruned before the next is taken: the dashboard's history is always empty.
        (
            {"SAGA_SAMPLE_INTERVAL": "60", "SAGA_SAMPLE_KEEP": "90"},
            r"SAGA_SAMPLE_KEEP=90.0 .*at least 2 x SAGA_SAMPLE_INTERVAL = 120.0",
        ),
        # The alert scan would raise on every pass, so no alert (not even the log line)
        # would ever go out.
        ({"SAGA_ALERT_WEBHOOK": "hooks.example.com/saga"}, r"SAGA_ALERT_WEBHOOK .*http"),
        ({"SAGA_ALERT_WEBHOOK": "https://"}, r"SAGA_ALERT_WEBHOOK .*http"),
        ({"SAGA_TRACE_EXPORT": "file:"}, r"SAGA_TRACE_EXPORT.*file:<path>"),
    ],
)
def test_other_settings_that_would_switch_a_guarantee_off(env, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize(
    "env",
    [
        {"SAGA_METRICS_PORT": "0"},
        {"SAGA_METRICS_PORT": "65535"},
        {"SAGA_ALERT_WEBHOOK": "https://hooks.example.com/saga"},
        {"SAGA_SAMPLE_INTERVAL": "60", "SAGA_SAMPLE_KEEP": "120"},
        {"SAGA_DB_POOL_SIZE": "1", "SAGA_PREFETCH_MULTIPLIER": "1"},
    ],
)
def test_values_at_the_bounds_are_accepted(env):
    Settings.from_env(env)


def test_overrides_are_checked_like_the_environment():
    with pytest.raises(ConfigurationError, match=r"SAGA_SWEEP_BATCH=0 .*at least 1"):
        Settings.from_env({}, sweep_batch=0)


ORCH = "postgresql+psycopg2://u:pw@db:5432/saga"


def test_participant_databases_one_url_a_template_or_named_entries():
    alone = Settings.from_env({"SAGA_DATABASE_URL": ORCH})
    assert alone.participant_database("inventory") == ORCH and not alone.participants_apart
    own = Settings.from_env({"SAGA_PARTICIPANT_DATABASE_URL": "postgresql://u@h/inv"})
    assert own.participant_database("inventory") == "postgresql://u@h/inv"
    each = Settings.from_env(
        {"SAGA_PARTICIPANT_DATABASE_URL": "postgresql://u@h/shop_{participant}"}
    )
    assert each.participant_database("payments") == "postgresql://u@h/shop_payments"
    named = Settings.from_env(
        {
            "SAGA_PARTICIPANT_DATABASE_URL": "inventory=postgresql://i:Pa%2Fss%231@h/inv "
            "*=postgresql://o@h/{participant}"
        }
    )
    assert named.participant_database("inventory") == "postgresql://i:Pa%2Fss%231@h/inv"
    assert named.participant_database("orders") == "postgresql://o@h/orders"
    assert "Pa/ss" not in repr(named)


@pytest.mark.parametrize(
    "value",
    [
        "inventory=postgresql://h/a inventory=postgresql://h/b",  # a name twice
        "inventory=postgresql://h/a nonsense",  # an entry that is not name=URL
        "not a url",
    ],
)
def test_participant_databases_that_do_not_parse_are_refused(value):
    with pytest.raises(ConfigurationError, match="SAGA_PARTICIPANT_DATABASE_URL"):
        Settings.from_env({"SAGA_PARTICIPANT_DATABASE_URL": value})


def test_a_participant_without_a_named_database_is_refused_not_sent_elsewhere():
    named = Settings.from_env({"SAGA_PARTICIPANT_DATABASE_URL": "inventory=postgresql://h/inv"})
    with pytest.raises(ConfigurationError, match="no database for participant 'orders'"):
        named.participant_database("orders")


def test_the_orchestrators_database_may_be_empty_only_in_a_participants_own_process():
    with pytest.raises(ConfigurationError, match="SAGA_DATABASE_URL"):
        Settings.from_env({"SAGA_DATABASE_URL": ""})
    own = Settings.from_env(
        {"SAGA_DATABASE_URL": "", "SAGA_PARTICIPANT_DATABASE_URL": "postgresql://u@h/inv"}
    )
    assert own.database_url == "" and own.participants_apart


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://u:hunter2 horse@h/inv",
        "postgresql://u:hunter2 horse@h/{participant}",
        "inventory=postgresql://u:hunter2 horse@h/inv",
    ],
)
def test_a_password_with_a_space_is_never_quoted_in_the_refusal(value):
    with pytest.raises(ConfigurationError, match="SAGA_PARTICIPANT_DATABASE_URL") as refused:
        Settings.from_env({"SAGA_PARTICIPANT_DATABASE_URL": value})
    assert "hunter2" not in str(refused.value) and "horse" not in str(refused.value)
