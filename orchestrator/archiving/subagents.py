"""Stopping subagents: every descendant with live work, at any depth, is stopped the way its
parent would stop it (its turns cancelled, its reminders deleted, its jobs stopped on their
hosts). A stop names, per descendant, exactly the items the census found
(``families.subagent.subagent_plan``), so a stop that arrives late (after an unarchive)
leaves alone what the descendant started since. Each descendant is handled on its own, so
one that fails does not keep the others running.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator import families
from orchestrator.archiving.stops import dispatch_stops
from orchestrator.families import Dispatcher
from orchestrator.items import ActivityItem
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)


def _stop_one(store: Store, dispatcher: Dispatcher, child: str, plan: dict[str, Any]) -> str:
    """Each family's part of the plan: stopped here when the family can (``stop_here``),
    otherwise sent as the family's stop (to the owning host for jobs)."""
    phrases: list[str] = []
    sent: list[ActivityItem] = []
    for spec in families.families():
        entries = plan.get(spec.plural)
        if spec.lua is None or not isinstance(entries, list):
            continue
        if spec.stop_here is not None:
            phrases.append(spec.stop_here(store, dispatcher, child, entries))
            continue
        items = [spec.from_plan(child, e) for e in entries] if spec.from_plan else []
        mine = [item for item in items if item is not None]
        sent.extend(mine)
        phrases.append(f"{len(mine)} {spec.name} stop(s) sent")
    report = dispatch_stops(dispatcher, child, sent, store=store)
    outcome = ", ".join(phrases)
    if report.failed:
        outcome += f", {len(report.failed)} dispatch failure(s)"
    return outcome


def stop_subagents(
    store: Store, dispatcher: Dispatcher, session_id: str, plans: dict[str, Any]
) -> dict[str, str]:
    """Stop, in each named descendant of ``session_id``, exactly the items of its plan:
    ``{descendantId: {"turns": [...], "jobs": [[jobId, host], ...], "reminders": [...]}}``.
    Returns ``{descendantId: outcome}``."""
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
