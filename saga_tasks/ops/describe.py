"""A saga definition as data and as a diagram: what ``saga-tasks describe`` prints.

Reads a definition only; no database, no broker. The JSON is an object whose ``steps``
list says, for each step in dependency order, its command and compensation, queue,
parents, timeout and policies; ``mermaid`` draws the graph (steps that cannot be undone
with a double border).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from saga_tasks.core.definitions import RetryPolicy, SagaDefinition, Step


def describe(definition: SagaDefinition) -> dict[str, Any]:
    """``definition`` as plain data (JSON-ready)."""
    return {
        "saga_type": definition.saga_type,
        "version": definition.version,
        "timeout_seconds": definition.timeout.total_seconds(),
        "steps": [_step(definition, s) for s in definition.steps],
        "mermaid": mermaid(definition),
    }


def _step(definition: SagaDefinition, s: Step) -> dict[str, Any]:
    return {
        "name": s.name,
        "action": s.action,
        "compensation": s.compensation,
        "compensable": s.compensable,
        "queue": s.queue,
        "depends_on": list(definition.parents[s.name]),
        "timeout_seconds": s.timeout.total_seconds(),
        "retry": _policy(s.retry, s.timeout),
        "compensation_retry": _policy(s.compensation_retry, s.timeout),
        "late_reply": s.late_reply.value,
        "on_dead_letter": s.on_dead_letter.value,
    }


def _policy(policy: RetryPolicy, timeout: timedelta) -> dict[str, Any]:
    cap = policy.max_interval or timeout * 10
    return {
        "max_attempts": policy.max_attempts,
        "backoff": policy.backoff,
        "max_interval_seconds": max(cap, timeout).total_seconds(),
        "jitter": policy.jitter,
    }


def mermaid(definition: SagaDefinition) -> str:
    """A Mermaid flowchart of the steps: an edge from each parent to its child; a step
    that cannot be undone drawn with a double border, its compensation named beside."""
    lines = ["flowchart LR"]
    ids = {s.name: f"s{i}" for i, s in enumerate(definition.steps)}
    for s in definition.steps:
        label = f"{s.name}<br/>{s.action}"
        if s.compensable:
            lines.append(f'    {ids[s.name]}["{label}<br/>undo: {s.compensation}"]')
        else:
            lines.append(f'    {ids[s.name]}[["{label}<br/>cannot be undone"]]')
    for s in definition.steps:
        for parent in definition.parents[s.name]:
            lines.append(f"    {ids[parent]} --> {ids[s.name]}")
    return "\n".join(lines)
