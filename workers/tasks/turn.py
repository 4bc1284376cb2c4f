"""``turn.step`` and ``turn.stop``."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore
from celery.signals import worker_ready, worker_shutdown

from orchestrator.agents import pool
from orchestrator.census import activity
from orchestrator.process import execwatch
from orchestrator.turn import steps, tools, turns
from workers.bulk import each_session
from workers.runtime import get_runtime, role

log = logging.getLogger(__name__)


def _runs_steps() -> bool:
    served = role()
    return served.family == "turn" and not served.control_only


@worker_ready.connect
def _start_warden(**_: Any) -> None:
    """A turn worker starts its exec warden as soon as it is ready, from the thread that
    lives as long as it does, so its first shell command is watched at once rather than
    after the warden's interpreter has started (a second of CPU, longer on a busy host)."""
    if _runs_steps():
        try:
            execwatch.warden(get_runtime().store).start()
        except OSError as exc:  # started with the first command instead
            log.warning("exec warden not started: %s", exc)


@worker_shutdown.connect
def _stop_warden(**_: Any) -> None:
    if _runs_steps():
        pool.close_all()  # the idle agents of external-agent sessions
        execwatch.warden(get_runtime().store).close()


@shared_task(name="turn.step", bind=True, acks_late=True)
def step(self: Task, session_id: str, turn_id: str, index: int) -> dict[str, Any]:
    """Run step ``index`` of a turn. A step the gate refuses ends the turn ``blocked`` and the
    task ends in the custom state ``REFUSED`` (a ``task-refused`` event, then ``Ignore``); a
    step that could not read the gate or write its result is retried later with back-off
    (fail closed; ``workers.retry.FleetTask``)."""
    rt = get_runtime()
    outcome = steps.run_step(
        rt.store,
        rt.dispatcher,
        rt.model,
        tools.run_tool,
        session_id,
        turn_id,
        int(index),
        stopping=rt.stopping,
    )
    if outcome in ("refused", "cancelled"):
        # The turn just ended because of an archive or a stop: record the archive quiet if
        # this was its last live work.
        activity.note_quiet(rt.store, session_id)
    if outcome == "refused":
        # A custom event gives the task its own state in Flower (REFUSED outranks STARTED);
        # Ignore then ends it without a task-succeeded that would paint it SUCCESS.
        self.send_event("task-refused", session_id=session_id, turn_id=turn_id, step=index)
        raise Ignore()
    return {"sessionId": session_id, "turnId": turn_id, "step": index, "outcome": outcome}


@shared_task(name="turn.stop", acks_late=True)
def stop(session_id: str, turn_ids: list[str]) -> dict[str, Any]:
    """Cancel exactly the named turns of a session."""
    rt = get_runtime()
    outcomes = turns.cancel_turns(rt.store, rt.dispatcher, session_id, list(turn_ids))
    activity.note_quiet(rt.store, session_id)
    return {"sessionId": session_id, "turns": outcomes}


@shared_task(name="turn.stop_many", acks_late=True)
def stop_many(stops: dict[str, list[str]]) -> dict[str, Any]:
    """Bulk form of ``turn.stop`` (one message per bulk-archive batch): ``{sessionId:
    [turnIds]}``. Each session is stopped on its own; one that fails is logged and the others
    are still stopped."""
    return {"sessions": each_session(stops, stop, "turn")}
