"""The ``reminder`` family: a stored reminder not yet fired. Reminder workers also consume the
maintenance queue (the fleet's scheduled tasks)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.families.base import MAINTENANCE_QUEUE, Dispatcher, Family, Task
from orchestrator.families.registry import FamilySpec, register
from orchestrator.items import ActivityItem, shorten

if TYPE_CHECKING:
    from orchestrator.storage.store import Store


def _item(sid: str, rid: str, fields: list[str | None]) -> ActivityItem:
    prompt, due = fields
    return ActivityItem(Family.REMINDER, rid, f'reminder "{shorten(prompt or "")}" due {due}', sid)


def _stop_here(store: Store, dispatcher: Dispatcher, sid: str, entries: list[Any]) -> str:
    from orchestrator.reminder.reminders import stop_reminders

    deleted = stop_reminders(store, sid, [r for r in entries if isinstance(r, str)])
    return f"{deleted} reminder(s) deleted"


def _from_plan(sid: str, entry: Any) -> ActivityItem | None:
    return ActivityItem(Family.REMINDER, entry, "", sid) if isinstance(entry, str) else None


SPEC = register(
    FamilySpec(
        name=Family.REMINDER,
        display="reminder",
        plural="reminders",
        task_module="workers.tasks.reminder",
        stop_task=Task.REMINDER_STOP,
        stop_many_task=Task.REMINDER_STOP_MANY,
        work_queue="reminder",
        extra_queues=(MAINTENANCE_QUEUE,),
        lua=Path(__file__).with_name("reminder.lua"),
        item=_item,
        from_plan=_from_plan,
        stop_here=_stop_here,
    )
)
