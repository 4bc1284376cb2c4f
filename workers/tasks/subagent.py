"""``subagent.stop``."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from orchestrator.archiving.subagents import stop_subagents
from orchestrator.census.activity import note_quiet
from workers.bulk import STOP_THREADS, each_session
from workers.runtime import get_runtime


@shared_task(name="subagent.stop", acks_late=True)
def stop(session_id: str, plans: dict[str, Any]) -> dict[str, Any]:
    """Stop, in the named descendants of a session (any depth), exactly the items their
    census found: ``{descendantId: {"turns", "jobs", "reminders"}}``
    (``orchestrator.families.subagent.subagent_plan``)."""
    rt = get_runtime()
    outcomes = stop_subagents(rt.store, rt.dispatcher, session_id, plans)
    note_quiet(rt.store, session_id)
    return {"sessionId": session_id, "subagents": outcomes}


@shared_task(name="subagent.stop_many", acks_late=True)
def stop_many(stops: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Bulk form of ``subagent.stop`` (one message per bulk-archive batch): ``{sessionId:
    {descendantId: plan}}``. Each session is handled on its own; one that fails is logged and the
    others are still stopped."""
    return {"sessions": each_session(stops, stop, "subagent", threads=STOP_THREADS)}
