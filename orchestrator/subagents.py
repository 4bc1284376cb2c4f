"""Stopping subagents: every descendant with live work, at any depth, is stopped the way its
parent would stop it (its turns cancelled, its reminders deleted, its jobs stopped on their
hosts). A stop names, per descendant, exactly the items the census found
(``stops.subagent_plan``), so a stop that arrives late (after an unarchive) leaves alone what
the descendant started since. Each descendant is handled on its own, so one that fails does
not keep the others running.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.activity import ActivityItem
from orchestrator.families import Dispatcher, Family
from orchestrator.reminders import stop_reminders
from orchestrator.stops import dispatch_stops
from orchestrator.store import Store
from orchestrator.turns import cancel_turns

log = logging.getLogger(__name__)


def _ids(plan: dict[str, Any], key: str) -> list[str]:
    return [i for i in plan.get(key) or [] if isinstance(i, str)]


def _stop_one(store: Store, dispatcher: Dispatcher, child: str, plan: dict[str, Any]) -> str:
    turns = cancel_turns(store, dispatcher, child, _ids(plan, "turns"))
    reminders = stop_reminders(store, child, _ids(plan, "reminders"))
    jobs = [
        ActivityItem(Family.JOB, entry[0], "", child, entry[1] or None)
        for entry in plan.get("jobs") or []
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
    ]
    report = dispatch_stops(dispatcher, child, jobs, store=store)
    outcome = (
        f"{len(turns)} turn(s) cancelled, {reminders} reminder(s) "
        f"deleted, {len(jobs)} job stop(s) sent"
    )
    if report.failed:
        outcome += f", {len(report.failed)} dispatch failure(s)"
    return outcome


def stop_subagents(
    store: Store, dispatcher: Dispatcher, session_id: str, plans: dict[str, Any]
) -> dict[str, str]:
    """Stop, in each named descendant of ``session_id``, exactly the items of its plan:
    ``{descendantId: {"turns": [...], "jobs": [[jobId, host], ...], "reminders": [...]}}``.
    Returns ``{descendantId: outcome}``. A plan in the old form (a bare list of descendant
    ids, which meant "everything they run") is ignored with a warning: it cannot say what
    existed at its archive, and the reconciler stops again what is still live."""
    if not isinstance(plans, dict):
        log.warning(
            "subagent stop of %s ignored: it names no items (old message form)",
            session_id,
            extra={"session_id": session_id, "family": "subagent"},
        )
        return {}
    outcomes: dict[str, str] = {}
    for child, plan in plans.items():
        extra = {"session_id": child, "family": "subagent"}
        try:
            outcomes[child] = _stop_one(
                store, dispatcher, child, plan if isinstance(plan, dict) else {}
            )
            log.info("subagent stopped: %s", outcomes[child], extra=extra)
        except Exception as exc:  # contained: the next descendant is still stopped
            outcomes[child] = f"error: {type(exc).__name__}: {exc}"
            log.warning("subagent stop failed: %s: %s", type(exc).__name__, exc, extra=extra)
            log.debug("subagent stop failed", exc_info=True, extra=extra)
    return outcomes
