"""The ``job`` family: a background process a session owns on some host. Its stops go to the
owning host's control queue (``job.ctl.<host>``), or to ``job.ctl`` for a job no worker has
taken yet."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.families.base import Dispatcher, Family, Task
from orchestrator.families.registry import FamilySpec, register
from orchestrator.items import ActivityItem

if TYPE_CHECKING:
    from orchestrator.storage.store import Store

log = logging.getLogger(__name__)


def _item(sid: str, jid: str, fields: list[str | None]) -> ActivityItem:
    label, host, pid = fields
    where = f" on {host} (pid {pid})" if host and pid else " (starting)"
    return ActivityItem(Family.JOB, jid, f"job {label}{where}", sid, host or None)


def _settle(store: Store, dispatcher: Dispatcher | None, sid: str, jids: list[str]) -> None:
    """A job whose lease lapsed is marked ``lost``: its owning worker stopped renewing it
    (dead, frozen, or cut off from Redis; its watchdog kills the process before the lapse)."""
    from orchestrator.job import scripts
    from orchestrator.states import JobState
    from orchestrator.storage.store import iso

    ms = store.now_ms()
    for jid in jids:
        scripts.job_end(
            store,
            job_id=jid,
            state=JobState.LOST,
            exit_code="",
            now_iso=iso(ms),
            allowed_from=(JobState.STARTING, JobState.RUNNING),
        )
        log.warning(
            "job %s: marked lost (its lease lapsed: its worker stopped renewing it)",
            jid,
            extra={"session_id": sid, "family": "job"},
        )


def _plan_entry(item: ActivityItem) -> Any:
    return [item.id, item.host]


def _from_plan(sid: str, entry: Any) -> ActivityItem | None:
    if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str):
        return ActivityItem(Family.JOB, entry[0], "", sid, entry[1] or None)
    return None


SPEC = register(
    FamilySpec(
        name=Family.JOB,
        display="job",
        plural="jobs",
        task_module="workers.tasks.job",
        stop_task=Task.JOB_STOP,
        stop_many_task=Task.JOB_STOP_MANY,
        work_queue="job",
        host_stops=True,
        lua=Path(__file__).with_name("job.lua"),
        item=_item,
        settle=_settle,
        plan_entry=_plan_entry,
        from_plan=_from_plan,
    )
)
