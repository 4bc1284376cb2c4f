"""The ``subagent`` family: a descendant session with live work, any depth. Not records a
session owns: the census derives one item per busy descendant, carrying the descendant's own
items (``ActivityItem.parts``); its stop names exactly those (``subagent_plan``)."""

from __future__ import annotations

from typing import Any

from orchestrator.families.base import Family, Task
from orchestrator.families.registry import FamilySpec, families, get, register
from orchestrator.items import ActivityItem


def subagent_plan(item: ActivityItem) -> dict[str, list[Any]]:
    """What a ``subagent`` stop does to one descendant: exactly the live items its census
    found, by family plural: ``{"turns": [turnId, ...], "jobs": [[jobId, host or null], ...],
    "reminders": [reminderId, ...]}`` (each entry is the family's ``plan_entry``), so a stop
    that arrives late touches nothing started since. Raises ``UnknownFamily`` for a part of
    no registered family."""
    plan: dict[str, list[Any]] = {spec.plural: [] for spec in families() if spec.lua}
    for part in item.parts:
        spec = get(part.family)
        plan.setdefault(spec.plural, []).append(spec.plan_entry(part))
    return plan


def _payload(items: list[ActivityItem]) -> dict[str, dict[str, list[Any]]]:
    return {item.id: subagent_plan(item) for item in items}


SPEC = register(
    FamilySpec(
        name=Family.SUBAGENT,
        display="subagent",
        plural="subagents",
        task_module="workers.tasks.subagent",
        stop_task=Task.SUBAGENT_STOP,
        stop_many_task=Task.SUBAGENT_STOP_MANY,
        payload=_payload,
    )
)
