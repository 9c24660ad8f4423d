"""Which tasks a queue runs, and what a message may not ask of the worker that runs it.

A Celery worker runs whatever registered task a message names, Celery's own built-ins
(``celery.accumulate``, ``celery.chord_unlock``, ...) included, and after the task returns
it publishes the message's ``chain``, ``callbacks`` or ``errbacks`` and takes part in its
``group`` or ``chord``, all as the worker's own broker user. A participant may publish to
the reply queue, and any service to a retry tier: without a gate, a message from one
service would make another's worker run its tasks and send what it asked for under the
other's name (a confused deputy). So a saga queue runs only the tasks that belong on it,
and no message may ask for follow-up work:

| queue                       | runs                                                  |
|-----------------------------|-------------------------------------------------------|
| ``saga.replies``            | the reply task                                        |
| ``saga.maintenance``        | the maintenance tasks (beat's jobs, schedule firings) |
| a participant's queue       | that participant's command and compensation handlers  |

Refused, wherever it arrives: a message of Celery's protocol 1 (a task in its body, not
its headers), a body that is not ``[args, kwargs, embed]``, any follow-up work in
``embed`` or a ``group`` header, an ``eta`` or ``countdown`` (a worker would hold the
message in memory until then), a ``timelimit`` (it could kill the child before any check
runs) and ``ignore_result`` false (a result written where nothing of ours reads it). Our
own messages carry none of these. A task of ours that arrives on another queue is
refused as well. A refused message is parked with the reason, counted and logged: the
worker that received it runs nothing and publishes nothing on its behalf.

The rule is data in, reason out (``refusal``): the worker's consumer applies it to each
delivery before Celery sees it, and a replay's checks apply it before a held message is
sent again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EMBEDDED = ("callbacks", "errbacks", "chain", "chord")
"""What a protocol 2 body's third element may carry: work Celery does after the task."""


@dataclass(frozen=True)
class TaskGate:
    """The tasks each saga queue runs (``tasks``: queue name -> task names)."""

    tasks: Mapping[str, frozenset[str]]
    _home: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        home = {task: queue for queue, names in self.tasks.items() for task in names}
        object.__setattr__(self, "_home", home)

    def home(self, task: str) -> str | None:
        """The queue a task of ours runs on; None for any other task."""
        return self._home.get(task)

    def guards(self, queue: str | None) -> bool:
        """Whether ``queue`` is a saga queue (its deliveries are judged here)."""
        return queue in self.tasks

    def refusal(self, queue: str | None, headers: Any, body: Any) -> str | None:
        """Why a delivery on ``queue`` (None: unknown) must not run; None when it may.

        ``headers`` are the message's application headers, ``body`` its decoded body.
        A delivery on a queue that is not ours, naming no task of ours, is not judged:
        the app it belongs to may use Celery's canvas there.
        """
        task = headers.get("task") if isinstance(headers, Mapping) else None
        if not isinstance(task, str) or not task:
            return self._protocol_one(queue, body)
        home = self.home(task)
        if not self.guards(queue) and home is None:
            return None
        where = queue or "a queue of unknown name"
        if not self.guards(queue):
            return f"task {_named(task)} runs on {home} only, not on {where}"
        if task not in self.tasks[queue or ""]:
            elsewhere = f" (it runs on {home})" if home else ""
            return f"task {_named(task)} does not run on {where}{elsewhere}"
        return _asks_for_more(headers, body)

    def _protocol_one(self, queue: str | None, body: Any) -> str | None:
        """A message naming no task in its headers: Celery runs it as protocol 1 if its
        body names one (refused on our queues, and for our tasks anywhere); naming none
        at all it is not a task message, which the consumer records as such."""
        named = body.get("task") if isinstance(body, Mapping) else None
        if not isinstance(named, str):
            return None
        if self.guards(queue) or self.home(named) is not None:
            return "a Celery protocol 1 message (its task named in its body, not its headers)"
        return None


def _asks_for_more(headers: Mapping[str, Any], body: Any) -> str | None:
    """Why a message of a task that belongs on its queue still must not run: it asks
    the worker for something beyond the task itself."""
    if not isinstance(body, list | tuple) or len(body) != 3:
        return "not a Celery protocol 2 body ([args, kwargs, embed])"
    args, kwargs, embed = body
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        return "not a Celery protocol 2 body ([args, kwargs, embed])"
    if embed is not None and not isinstance(embed, Mapping):
        return "not a Celery protocol 2 body (its third element is not an object)"
    asked = [key for key in EMBEDDED if (embed or {}).get(key)]
    if headers.get("group") is not None:
        asked.append("group")
    if asked:
        return f"the message asks for follow-up work ({', '.join(asked)}), which is never ours"
    if headers.get("eta") is not None or headers.get("countdown") is not None:
        return "the message asks to wait in the worker's memory (eta), which is never ours"
    limits = headers.get("timelimit")
    if limits is not None and any(v is not None for v in _as_list(limits)):
        return "the message sets its own time limit (timelimit), which is never ours"
    if headers.get("ignore_result") is False:
        return "the message asks for its result to be stored (ignore_result false)"
    return None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _named(task: str) -> str:
    return repr(task[:100])


__all__ = ["EMBEDDED", "TaskGate"]
