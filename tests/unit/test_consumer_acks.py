"""The worker consumer writes acks at once on the event loop's thread (why: the
consumer module's docstring); the benchmark's stock and fixed chains show the effect."""

from __future__ import annotations

import threading
from typing import Any

from saga_tasks.worker.consumer import ImmediateAckConsumer, SagaConsumer


class _Hub:
    def __init__(self) -> None:
        self._loop_thread = threading.get_ident()
        self.scheduled: list[Any] = []

    def call_soon(self, callback: Any) -> Any:
        self.scheduled.append(callback)
        return callback


def _consumer() -> ImmediateAckConsumer:
    consumer = ImmediateAckConsumer.__new__(ImmediateAckConsumer)
    consumer.hub = _Hub()
    return consumer


def test_on_the_loop_thread_the_ack_is_written_now():
    consumer, acked = _consumer(), []
    consumer.call_soon_ack(lambda *a: acked.append(a), "logger", ("errors",))
    assert acked == [("logger", ("errors",))]
    assert consumer.hub.scheduled == []


def test_from_another_thread_the_ack_goes_through_the_loop():
    consumer, acked = _consumer(), []
    worker = threading.Thread(target=lambda: consumer.call_soon_ack(lambda *a: acked.append(a)))
    worker.start()
    worker.join()
    assert acked == []
    assert len(consumer.hub.scheduled) == 1


def test_a_failing_ack_is_logged_not_raised(caplog):
    def broken(*_: Any) -> None:
        raise RuntimeError("channel closed")

    _consumer().call_soon_ack(broken)
    assert "ack or reject failed" in caplog.text


def test_the_saga_consumer_has_the_fix():
    assert issubclass(SagaConsumer, ImmediateAckConsumer)
