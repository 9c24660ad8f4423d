"""``ServiceUnavailable`` is the one way an unreachable service is reported, and it never
carries a password: the URL is masked and the detail scrubbed wherever it is made."""

from __future__ import annotations

import pickle

from saga_tasks.errors import ServiceUnavailable

URL = "postgresql+psycopg2://app:s3cr/et#9@db.internal:5432/shop"


def test_the_url_is_masked_and_the_detail_scrubbed_of_every_piece_of_the_password():
    driver = OSError('could not translate host name "et#9@db.internal" to address\nmore')
    error = ServiceUnavailable("PostgreSQL", URL, driver)
    assert error.url == "postgresql+psycopg2://***@db.internal:5432/shop"
    assert error.detail == 'could not translate host name "***@db.internal" to address'
    for piece in ("s3cr", "et#9", "s3cr/et#9"):
        assert piece not in str(error)


def test_a_text_detail_is_scrubbed_and_cut_too():
    error = ServiceUnavailable("RabbitMQ", "amqp://u:hunter22@mq//", "refused hunter22 " * 40)
    assert "hunter22" not in str(error) and error.url == "amqp://u:***@mq//"
    assert len(error.detail) == 300


def test_made_again_from_its_own_parts_it_says_the_same():
    first = ServiceUnavailable("Redis", "redis://:pw-123@cache:6379/0", OSError("pw-123 no"))
    again = ServiceUnavailable(first.service, first.url, first.detail)
    assert str(again) == str(first) == "cannot reach Redis at redis://:***@cache:6379/0: *** no"
    assert "pw-123" not in pickle.dumps(first.args).decode("latin-1")


def test_a_purged_saga_is_told_in_utc_whatever_zone_the_database_session_speaks():
    from datetime import datetime, timedelta, timezone

    from saga_tasks.errors import SagaPurged

    new_york = timezone(timedelta(hours=-5))
    told = SagaPurged(
        "6b354f96-73dc-4e47-b48b-02921f11da44",
        status="COMPENSATED",
        finished_at=datetime(2026, 12, 4, 7, 0, tzinfo=new_york),
        purged_at=datetime(2027, 1, 3, 21, 0, tzinfo=new_york),
    )
    assert "purged at 2027-01-04 02:00 UTC" in str(told)
    assert "it ended COMPENSATED at 2026-12-04 12:00 UTC" in str(told)
