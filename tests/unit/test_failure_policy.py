"""What a worker does with a handler's unexpected exception (``worker.failures``), and
that the README and the docs say the same wherever it speaks of one."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from saga_tasks.config import Settings
from saga_tasks.messaging.publisher import PublishResult
from saga_tasks.runtime.holding import DEAD_LETTER
from saga_tasks.worker.failures import H_RETRY, FailurePolicy
from tests.docs import all_text


class _Publisher:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def publish(self, messages: list[Any]) -> PublishResult:
        self.sent.extend(messages)
        return PublishResult(published=tuple(m.message_id for m in messages), failed=())


class _Holding:
    def __init__(self) -> None:
        self.held: list[dict[str, Any]] = []

    def hold(self, message: Any, **how: Any) -> None:
        self.held.append({"message": message, **how})


def _handled(policy: FailurePolicy, retries: int) -> None:
    request = SimpleNamespace(
        id="m-1",
        task="inventory.reserve",
        kwargs={},
        headers={H_RETRY: retries} if retries else {},
        delivery_info={},
        properties={},
    )
    with policy.guard(request, "inventory.commands"):
        raise RuntimeError("a bug")


def test_an_unexpected_exception_is_retried_through_the_tiers_then_dead_lettered():
    settings = Settings()
    publisher, holding = _Publisher(), _Holding()
    policy = FailurePolicy(
        counters=lambda _queue: None,
        publisher=lambda: publisher,
        holding=holding,
        retry_delays=settings.retry_delays,
        unknown_error_retries=settings.unknown_error_retries,
        poison_limit=settings.poison_limit,
    )
    for retries in range(settings.unknown_error_retries):
        _handled(policy, retries)
    assert [m.queue for m in publisher.sent] == [
        "inventory.commands.retry.1s",
        "inventory.commands.retry.10s",
    ]
    assert holding.held == []
    _handled(policy, settings.unknown_error_retries)
    (dead,) = holding.held
    assert dead["holding"] == DEAD_LETTER
    assert dead["reason"] == "retries exhausted (2) after RuntimeError"


def test_every_mention_of_an_unexpected_exception_says_it_is_retried_first():
    text = all_text()
    # Sentences, and table rows (a row's last cell may end without a full stop).
    pieces = re.split(r"(?<=\.)\s+|\n(?=\|)", text)
    mentions = [
        p for p in pieces if re.search(r"unexpected (exception|error)|any other exception", p)
    ]
    assert len(mentions) >= 3, mentions
    for mention in mentions:
        assert "SAGA_UNKNOWN_ERROR_RETRIES" in mention and "tiers" in mention, mention
