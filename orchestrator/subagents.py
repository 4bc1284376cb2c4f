"""Stopping subagents: every running descendant of a session, at any depth, is stopped the
way its parent would stop it (its turns cancelled, its reminders deleted, its jobs stopped on
their hosts). Each descendant is handled on its own, so one that fails does not keep the
others running.
"""

from __future__ import annotations

import logging

from orchestrator.activity import own_items
from orchestrator.families import Dispatcher, Family
from orchestrator.reminders import stop_reminders
from orchestrator.stops import dispatch_stops
from orchestrator.store import Store
from orchestrator.turns import cancel_session_turns

log = logging.getLogger(__name__)


def stop_subagents(
    store: Store, dispatcher: Dispatcher, session_id: str, descendant_ids: list[str]
) -> dict[str, str]:
    """Stop the named descendants of ``session_id``. Returns ``{sessionId: outcome}``."""
    outcomes: dict[str, str] = {}
    for child in descendant_ids:
        extra = {"session_id": child, "family": "subagent"}
        try:
            turns = cancel_session_turns(store, dispatcher, child)
            reminders = stop_reminders(store, child)
            jobs = [i for i in own_items(store, child) if i.family is Family.JOB]
            report = dispatch_stops(dispatcher, child, jobs, store=store)
            outcomes[child] = (
                f"{len(turns)} turn(s) cancelled, {reminders} reminder(s) "
                f"deleted, {len(jobs)} job stop(s) sent"
            )
            if report.failed:
                outcomes[child] += f", {len(report.failed)} dispatch failure(s)"
            log.info("subagent stopped: %s", outcomes[child], extra=extra)
        except Exception as exc:  # contained: the next descendant is still stopped
            outcomes[child] = f"error: {type(exc).__name__}: {exc}"
            log.warning("subagent stop failed: %s: %s", type(exc).__name__, exc, extra=extra)
            log.debug("subagent stop failed", exc_info=True, extra=extra)
    return outcomes
