"""A fifth activity family that exists only in the tests: its own module (this one and the
Lua beside it) and one registry entry, nothing edited elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.families import FamilySpec
from orchestrator.items import ActivityItem
from orchestrator.storage.store import Store

NAME = "probe"


def _item(sid: str, pid: str, fields: list[str | None]) -> ActivityItem:
    return ActivityItem(NAME, pid, f"probe {fields[0]}", sid)


def _from_plan(sid: str, entry: Any) -> ActivityItem | None:
    return ActivityItem(NAME, entry, "", sid) if isinstance(entry, str) else None


SPEC = FamilySpec(
    name=NAME,
    display="probe",
    plural="probes",
    task_module="tests.orchestrator.probe.tasks",
    stop_task="probe.stop",
    stop_many_task="probe.stop_many",
    work_queue="probe",
    lua=Path(__file__).with_name("probe.lua"),
    item=_item,
    from_plan=_from_plan,
)


def start_probe(store: Store, sid: str, pid: str, label: str) -> None:
    """Store a live probe of session ``sid`` (what the family's own code would write)."""
    store.redis.sadd(f"{store.keys.prefix}probe:live:{sid}", pid)
    store.redis.hset(f"{store.keys.prefix}probe:{pid}", mapping={"state": "on", "label": label})
