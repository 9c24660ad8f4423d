"""Settings from the environment, masked URLs, and the topology's names and arguments."""

from __future__ import annotations

import re

import pytest

from saga_tasks.config import Settings
from saga_tasks.errors import ConfigurationError
from saga_tasks.messaging.topology import (
    DEAD_LETTER_QUEUE,
    PARKING_QUEUE,
    REPLY_QUEUE,
    Topology,
    command_routing_key,
    retry_queue,
)
from saga_tasks.urls import mask_url, scrub
from tests.docs import page


def test_settings_read_from_env_with_types():
    s = Settings.from_env(
        {"SAGA_RELAY_INTERVAL": "0.5", "SAGA_DB_PREPARE": "0", "SAGA_DB_POOL_SIZE": "3"}
    )
    assert (s.relay_interval, s.db_prepare, s.db_pool_size) == (0.5, False, 3)
    assert Settings.from_env({}).db_prepare is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SAGA_RELAY_INTERVAL": "soon"}, "not a valid float"),
        ({"SAGA_DB_PREPARE": "perhaps"}, "not a valid bool"),
        ({"SAGA_QUEUE_TYPE": "stream"}, "classic' or 'quorum"),
        ({"SAGA_LOG_FORMAT": "xml"}, "text' or 'json"),
        ({"SAGA_PUBLISH_MODE": "later"}, "async' or 'sync"),
        ({"SAGA_RELAY_MIN_AGE": "0"}, "must be positive"),
        ({"SAGA_MARK_INTERVAL": "6"}, "must be below SAGA_RELAY_MIN_AGE"),
    ],
)
def test_bad_settings_are_named(env, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize("secret", ["hunter2", "Pa/ss#w0rd", "qu?ery", "at@sign", "c:olon"])
def test_mask_url_hides_any_password_written_into_a_url(secret):
    for url in (
        f"postgresql+psycopg2://user:{secret}@db.internal:5432/saga",
        f"amqp://user:{secret}@mq.internal:5672//",
        f"redis://:{secret}@cache:6379/0",
    ):
        masked = mask_url(url)
        assert secret not in masked and "***" in masked, masked
        assert masked.split("@")[-1] in url  # the host, port and path stay readable


def test_mask_url_hides_only_the_password():
    assert mask_url("amqp://guest:secret@host:5672/v") == "amqp://guest:***@host:5672/v"
    assert mask_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_the_reference_documents_every_setting():
    """Written from Settings by tools.docs_reference; test_docs_reference checks it is current."""
    reference = page("reference/settings.md").read_text()
    for variable, _default, _doc in Settings.documented():
        assert f"| `{variable}` |" in reference, f"{variable} missing from the settings reference"


def test_topology_names_and_arguments():
    t = Topology(command_queues=("inventory.commands",))
    work = t.queue("inventory.commands")
    assert work.queue_arguments == {"x-queue-type": "classic", "x-dead-letter-exchange": "saga.dlx"}
    retry = t.queue(retry_queue("inventory.commands", 10))
    assert retry.queue_arguments["x-message-ttl"] == 10_000
    assert retry.queue_arguments["x-dead-letter-exchange"] == ""
    assert retry.queue_arguments["x-dead-letter-routing-key"] == "inventory.commands"
    assert t.queue(DEAD_LETTER_QUEUE).queue_arguments["x-queue-mode"] == "lazy"
    assert {q.name for q in t.work_queues()} == {
        "inventory.commands",
        REPLY_QUEUE,
        "saga.maintenance",
    }
    assert PARKING_QUEUE in {q.name for q in t.all_queues()}
    assert (
        command_routing_key("inventory.commands", "inventory.reserve")
        == "command.inventory.reserve.v1"
    )
    assert re.fullmatch(r"command\.inventory\.#", work.routing_key)


def test_quorum_topology_bounds_deliveries():
    t = Topology(command_queues=("a.commands",), queue_type="quorum")
    args = t.queue("a.commands").queue_arguments
    assert args["x-queue-type"] == "quorum"
    assert args["x-delivery-limit"] >= 1
    assert args["x-dead-letter-strategy"] == "at-least-once"
    assert "x-queue-mode" not in t.queue(DEAD_LETTER_QUEUE).queue_arguments


def test_scrub_takes_the_password_and_its_pieces_out_of_a_drivers_words():
    url = "amqp://guest:Pa/ss#w0rd@127.0.0.1:5672//"
    said = "Port could not be cast to integer value as 'Pa' (from 'Pa/ss#w0rd')"
    assert "Pa" not in scrub(said, url) and "w0rd" not in scrub(said, url)
    assert scrub("connection refused", url) == "connection refused"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://bob:ss@w:rd@db:5432/saga", "postgresql://***@db:5432/saga"),
        ("amqp://guest:S3cr/t:x@mq:5672//", "amqp://***@mq:5672//"),
        ("redis://:sp ace@cache:6379/0", "redis://***@cache:6379/0"),
        ("amqp://guest:S3cr/t", "amqp://***"),  # no @ left: the "port" is a piece of it
    ],
)
def test_a_malformed_url_is_masked_whole_and_named_malformed(url, masked):
    assert mask_url(url) == masked
    with pytest.raises(ConfigurationError, match="SAGA_BROKER_URL is malformed") as raised:
        Settings.from_env({"SAGA_BROKER_URL": url})
    assert str(raised.value).endswith(f": {masked}")


def test_a_colon_in_a_password_is_well_formed():
    url = "amqp://guest:c:olon@mq:5672//"
    assert mask_url(url) == "amqp://guest:***@mq:5672//"
    assert Settings.from_env({"SAGA_BROKER_URL": url}).broker_url == url


def test_scrub_takes_out_every_run_of_the_pieces_a_parser_may_quote():
    url = "amqp://guest:a:b/c#d?e@f g@127.0.0.1:5672//"
    said = "Port could not be cast to integer value as 'a:b' near 'e@f g@127.0.0.1'"
    assert (
        scrub(said, url) == "Port could not be cast to integer value as '***' near '***@127.0.0.1'"
    )
