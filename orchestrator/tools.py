"""The tool calls a turn can make, as the turn runtime executes them.

Each call is reported as ACP ``tool_call`` then ``tool_call_update`` (``completed``,
``failed``, or ``cancelled`` when the turn was stopped while the tool ran: an in-flight tool
call settles as a cancelled tool result, never vanishes, except in an archived session, where
nothing lands after the archive).

Every launch is conditional on the turn still running and on the copy of the step that asks
for it still owning the step (its ``StepGuard``, ``orchestrator/fencing.py``): the
``tool_call`` update is recorded only then (and the exec child is started only after that),
and jobs, reminders and subagents are stored by scripts that refuse otherwise
(``TurnStopped``; a superseded copy's conversation write raises ``StepSuperseded``). A launch
over one of the ``FLEET_MAX_*`` limits (``orchestrator/limits.py``) stores nothing and settles
its tool call ``failed`` with the limit's message; the turn goes on to its next step.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading

from orchestrator.errors import LimitReached, SessionArchived, TurnStopped
from orchestrator.families import Dispatcher
from orchestrator.fencing import StepGuard
from orchestrator.jobs import create_job
from orchestrator.model import ModelAction
from orchestrator.processes import die_with_parent
from orchestrator.reminders import create_reminder
from orchestrator.sessions import create_session, get_session
from orchestrator.steps import CANCEL_POLL
from orchestrator.store import Store, new_id
from orchestrator.turns import record_update, start_turn

log = logging.getLogger(__name__)


def _exec(seconds: float, cancel: threading.Event) -> str:
    """Run a child process for ``seconds`` inside the turn; kill it if the turn is stopped."""
    proc = subprocess.Popen(
        ["sleep", f"{seconds:g}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Its own process group, and it dies with the worker thread running the step.
        preexec_fn=die_with_parent(),
    )
    try:
        while proc.poll() is None:
            if cancel.wait(CANCEL_POLL):
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
                return "cancelled"
        return "completed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    finally:
        if proc.poll() is None:
            proc.kill()


def run_tool(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    guard: StepGuard,
    action: ModelAction,
    cancel: threading.Event,
) -> str | None:
    """Execute one tool call for a turn step (the copy of it ``guard`` names). Returns the tool
    result's text, or ``None`` when the call was aborted: the turn no longer runs (nothing was
    launched) or ``cancel`` was set while an exec child ran (the child is killed).
    Raises ``StepSuperseded`` (another copy of the step began), ``StoreUnavailable``."""
    turn_id, token = guard.turn_id, guard.token
    call_id = new_id("call")
    title = {
        "exec": f"exec {action.seconds:g}s",
        "run": f"background job {action.seconds:g}s",
        "spawn": "subagent",
        "remind": f"reminder in {action.seconds:g}s",
    }[action.tool or ""]
    extra = {"session_id": session_id, "turn_id": turn_id}
    update: dict[str, object] = {
        "sessionUpdate": "tool_call",
        "turnId": turn_id,
        "toolCallId": call_id,
        "title": title,
        "kind": "execute",
        "status": "in_progress",
    }
    if not record_update(store, session_id, update, token=token):
        log.info("tool %s not launched: the turn no longer runs", action.tool, extra=extra)
        return None
    try:
        status, text = _launch(store, dispatcher, session_id, guard, action, cancel)
    except (TurnStopped, SessionArchived):  # archived: the archive stopped this turn too
        log.info("tool %s not launched: the turn no longer runs", action.tool, extra=extra)
        return None
    except LimitReached as exc:  # a tool error the turn sees; it goes on to its next step
        status, text = "failed", f"{action.tool} refused: {exc.message}"
    settled = record_update(
        store,
        session_id,
        {
            "sessionUpdate": "tool_call_update",
            "turnId": turn_id,
            "toolCallId": call_id,
            "status": status,
            "content": [{"type": "content", "content": {"type": "text", "text": text}}],
        },
        settle=status == "cancelled",
        token=token,
    )
    log.info("tool %s: %s%s", action.tool, text, "" if settled else " (dropped)", extra=extra)
    return None if status == "cancelled" else text


def _launch(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    guard: StepGuard,
    action: ModelAction,
    cancel: threading.Event,
) -> tuple[str, str]:
    """Run the tool; returns (status, text). Raises ``TurnStopped`` when a launch was refused
    because the turn no longer runs."""
    if action.tool == "exec":
        outcome = _exec(action.seconds, cancel)
        status = outcome if outcome in ("completed", "cancelled") else "failed"
        return status, f"exec {action.seconds:g}s: {outcome}"
    if action.tool == "run":
        jid = create_job(
            store,
            dispatcher,
            session_id,
            action.seconds,
            f"sleep {action.seconds:g}s",
            guard=guard,
        )
        return "completed", f"started job {jid}"
    if action.tool == "spawn":
        parent = get_session(store, session_id)
        child = create_session(store, parent.cwd, parent_id=session_id, guard=guard)
        start_turn(store, dispatcher, child.session_id, action.text, source="subagent", guard=guard)
        return "completed", f"started subagent {child.session_id}"
    rid = create_reminder(store, session_id, action.seconds, action.text, guard=guard)
    return "completed", f"stored reminder {rid}"
