"""A saga definition as data and as a diagram: what ``saga-tasks describe`` prints.

Reads a definition only; no database, no broker. The JSON is an object whose ``steps``
list says, for each step in dependency order, its command and compensation, queue,
parents, condition, pivot, human wait, timeout and policies; ``mermaid`` draws the graph
(steps that cannot be undone with a double border, human steps as hexagons, the pivot
in bold, conditions on the edges into their steps).
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
        "pivot": definition.pivot,
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
        "when": str(s.when) if s.when is not None else None,
        "pivot": s.pivot,
        "human": _human(s),
    }


def _human(s: Step) -> dict[str, Any] | None:
    if s.human is None:
        return None
    escalate = s.human.escalate_after
    return {
        "schema": s.human.schema_name,
        "decide_within_seconds": s.timeout.total_seconds(),
        "escalate_after_seconds": escalate.total_seconds() if escalate else None,
        "on_timeout": s.human.on_timeout.value,
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
        name = f"<b>{s.name} (pivot)</b>" if s.pivot else s.name
        if s.human is not None:
            lines.append(f'    {ids[s.name]}{{{{"{name}<br/>a person decides"}}}}')
        elif s.compensable:
            label = f"{name}<br/>{s.action}<br/>undo: {s.compensation}"
            lines.append(f'    {ids[s.name]}["{label}"]')
        else:
            lines.append(f'    {ids[s.name]}[["{name}<br/>{s.action}<br/>cannot be undone"]]')
    for s in definition.steps:
        edge = f'-- "{_quoted(str(s.when))}" -->' if s.when is not None else "-->"
        for parent in definition.parents[s.name]:
            lines.append(f"    {ids[parent]} {edge} {ids[s.name]}")
    return "\n".join(lines)


def _quoted(text: str) -> str:
    """Mermaid labels end at a double quote: write it as its entity."""
    return text.replace('"', "#quot;")
