"""The tool calls a turn makes, as the turn runtime executes them (the tools themselves, their
argument schemas and families: ``orchestrator/turn/toolbox.py``).

Each call is reported as ACP ``tool_call`` then ``tool_call_update`` (``completed``,
``failed``, or ``cancelled`` when the turn was stopped while the tool ran: an in-flight tool
call settles as a cancelled tool result, never vanishes, except in an archived session, where
nothing lands after the archive).

Every launch is conditional on the turn still running and on the copy of the step that asks
for it still owning the step (its ``StepGuard``, ``orchestrator/session/fencing.py``): the
``tool_call`` update is recorded only then (and the exec child is started only after that),
and jobs, reminders and subagents are stored by scripts that refuse otherwise
(``TurnStopped``; a superseded copy's conversation write raises ``StepSuperseded``). A launch
over one of the ``FLEET_MAX_*`` limits (``orchestrator/session/limits.py``) stores nothing and
settles
its tool call ``failed`` with the limit's message; so does a call the registry cannot parse
(unknown tool, malformed arguments: ``ToolArgumentsError``). So does a spawn whose subagent
was archived on its own between its creation and its first turn (it had no work yet, so an
archive naming it, or a bulk archive selecting it by its cwd, could take it): nothing ran in
it, and the spawning turn goes on. The model sees any of these as the call's result in its
next step. The ``tool_call`` update carries the tool's name in
``_meta.agentFleet.tool`` and its arguments in ``rawInput`` (``orchestrator/models/chat.py`` reads
them back into the conversation).
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time
from typing import IO, Any

from orchestrator.errors import LimitReached, SessionArchived, TurnStopped
from orchestrator.families import Dispatcher
from orchestrator.job.jobs import create_job
from orchestrator.models.model import ToolCall
from orchestrator.process import containment, execwatch
from orchestrator.process.processes import under_timeout
from orchestrator.reminder.reminders import create_reminder
from orchestrator.session.fencing import StepGuard
from orchestrator.session.sessions import create_session, get_session
from orchestrator.storage.store import Store, new_id
from orchestrator.turn.steps import CANCEL_POLL, STEP_LEASE_MS
from orchestrator.turn.toolbox import (
    SetReminderArgs,
    ShellArgs,
    SpawnSubagentArgs,
    StartJobArgs,
    ToolArgumentsError,
    parse_call,
    shown_name,
    stored_arguments,
)
from orchestrator.turn.turns import record_update, start_turn

log = logging.getLogger(__name__)

#: Most bytes of a ``shell`` command's output (stdout and stderr) its tool result keeps.
OUTPUT_MAX_BYTES = 16_384


def _drain(pipe: IO[bytes], keep: int, box: bytearray, total: list[int]) -> None:
    """Read ``pipe`` to its end, keeping its first ``keep`` bytes in ``box`` and counting all
    of them in ``total[0]``."""
    while chunk := pipe.read(65536):
        total[0] += len(chunk)
        if len(box) < keep:
            box.extend(chunk[: keep - len(box)])


def _shell(
    store: Store, guard: StepGuard, args: ShellArgs, cwd: str, cancel: threading.Event
) -> tuple[str, str]:
    """Run ``args.command`` with ``/bin/sh`` in ``cwd`` inside the turn, as the worker's user;
    where ``cwd`` is not a directory on this worker, in an empty temporary one (removed after,
    and said in the result) rather than anywhere that holds files. Returns (status, text)."""
    if os.path.isdir(cwd):
        return _run_shell(store, guard, args, cwd, cancel, "")
    with tempfile.TemporaryDirectory(prefix="fleet-shell-") as scratch:
        note = f"(the session's cwd {cwd} is not a directory on this worker: ran in {scratch})\n"
        return _run_shell(store, guard, args, scratch, cancel, note)


def _run_shell(
    store: Store, guard: StepGuard, args: ShellArgs, cwd: str, cancel: threading.Event, note: str
) -> tuple[str, str]:
    """Run the command as a contained process tree (``orchestrator/process/containment.py``) and
    kill the whole tree at its timeout, once ``cancel`` is set, and when the command ends: a
    process it started in the background (even one that left its process group, ``setsid
    CMD &``) does not outlive its tool call. This process's exec warden
    (``orchestrator/process/execwatch.py``) kills the tree if the step's lease runs out (a frozen
    worker). Returns (status, text): the exit status and the first
    ``OUTPUT_MAX_BYTES`` of its output (stdout and stderr), after ``note``."""
    keep = OUTPUT_MAX_BYTES
    # Under timeout (no time limit of its own: this loop keeps it), leading its own process
    # group, which dies whole with the worker thread running the step (SIGTERM, then SIGKILL
    # after KILL_GRACE_SECONDS), before the step's lease lapses and a resumed copy runs it;
    # the rest of the tree dies with the worker's watchdogs (containment).
    argv, preexec = under_timeout(["/bin/sh", "-c", args.command])
    tree = containment.start(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec,
    )
    proc = tree.process
    output, total = bytearray(), [0]
    assert proc.stdout is not None
    drain = (proc.stdout, keep, output, total)
    reader = threading.Thread(target=_drain, args=drain, daemon=True)
    reader.start()
    started, why = time.monotonic(), ""
    warden, watch = execwatch.warden(store), None
    try:
        try:
            watch = warden.watch(guard.turn_id, guard.token, STEP_LEASE_MS, proc.pid, tree.handle)
        except OSError as exc:  # the command runs on, watched only by the step
            log.warning("exec warden of turn %s not started: %s", guard.turn_id, exc)
        while True:
            try:
                proc.wait(CANCEL_POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            if watch is not None:
                try:
                    warden.ensure()
                except OSError as exc:
                    log.warning("exec warden of turn %s not started again: %s", guard.turn_id, exc)
            if cancel.is_set():
                why = "cancelled"
            elif time.monotonic() - started >= args.timeout_seconds:
                why = f"timed out after {args.timeout_seconds:g}s"
            if why:
                tree.stop(2)
                break
    finally:
        tree.close()  # what the command left behind ends with its tool call
        warden.drop(watch)
    reader.join(2)
    text = note + output.decode("utf-8", "replace")
    if total[0] > keep:
        text += f"\n(output cut to its first {keep} of {total[0]} bytes)"
    if why == "cancelled":
        return "cancelled", f"$ {args.command}: cancelled"
    if why:
        return "failed", f"$ {args.command}: {why}\n{text}"
    status = "completed" if proc.returncode == 0 else "failed"
    return status, f"$ {args.command}: exit {proc.returncode}\n{text}"


def _title(call: ToolCall, parsed: Any) -> str:
    if isinstance(parsed, ShellArgs):
        return parsed.command[:200]
    if isinstance(parsed, StartJobArgs):
        return f"background job: {parsed.command[:200]}"
    if isinstance(parsed, SetReminderArgs):
        return f"reminder in {parsed.seconds:g}s"
    return "subagent" if isinstance(parsed, SpawnSubagentArgs) else shown_name(call)


def run_tool(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    guard: StepGuard,
    call: ToolCall,
    cancel: threading.Event,
) -> str | None:
    """Execute one tool call for a turn step (the copy of it ``guard`` names). Returns the tool
    result's text, or ``None`` when the call was aborted: the turn no longer runs (nothing was
    launched) or ``cancel`` was set while a shell child ran (the child is killed).
    Raises ``StepSuperseded`` (another copy of the step began), ``StoreUnavailable``."""
    turn_id, token = guard.turn_id, guard.token
    call_id = new_id("call")
    try:
        tool, parsed = parse_call(call, store.settings.tools)
        problem = ""
    except ToolArgumentsError as exc:
        tool, parsed, problem = None, None, str(exc)
    extra = {"session_id": session_id, "turn_id": turn_id}
    update: dict[str, object] = {
        "sessionUpdate": "tool_call",
        "turnId": turn_id,
        "toolCallId": call_id,
        "title": _title(call, parsed),
        "kind": "execute",
        "status": "in_progress",
        "rawInput": stored_arguments(call),
        "_meta": {"agentFleet": {"tool": shown_name(call)}},
    }
    if not record_update(store, session_id, update, token=token):
        log.info("tool %s not launched: the turn no longer runs", shown_name(call), extra=extra)
        return None
    child_archived = False
    try:
        if tool is None:
            status, text = "failed", problem
        else:
            status, text = _launch(store, dispatcher, session_id, guard, parsed, cancel)
    except (TurnStopped, SessionArchived):  # archived: the archive stopped this turn too
        log.info("tool %s not launched: the turn no longer runs", shown_name(call), extra=extra)
        return None
    except LimitReached as exc:  # a tool error the turn sees; it goes on to its next step
        status, text = "failed", f"{call.name} refused: {exc.message}"
    except _SubagentArchived as exc:
        child_archived = True
        status, text = (
            "failed",
            (
                f"{call.name}: subagent {exc.child} was archived before its first turn began (it "
                "had no work yet); nothing ran in it"
            ),
        )
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
    log.info(
        "tool %s: %s%s", shown_name(call), text[:200], "" if settled else " (dropped)", extra=extra
    )
    if child_archived and not settled:
        return None  # the subagent went with this turn's own lineage: the archive stopped it
    return None if status == "cancelled" else text


class _SubagentArchived(Exception):
    """The subagent a spawn created was archived before its first turn could be stored."""

    def __init__(self, child: str) -> None:
        super().__init__(child)
        self.child = child


def _launch(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    guard: StepGuard,
    args: Any,
    cancel: threading.Event,
) -> tuple[str, str]:
    """Run the tool its validated ``args`` name; returns (status, text). Raises
    ``TurnStopped`` when a launch was refused because the turn no longer runs,
    ``LimitReached``, ``_SubagentArchived`` (a spawned subagent archived before its first
    turn)."""
    if isinstance(args, ShellArgs):
        return _shell(store, guard, args, get_session(store, session_id).cwd, cancel)
    if isinstance(args, StartJobArgs):
        jid = create_job(
            store,
            dispatcher,
            session_id,
            args.timeout_seconds,
            args.command[:200],
            command=args.command,
            guard=guard,
        )
        return "completed", f"started job {jid}"
    if isinstance(args, SpawnSubagentArgs):
        parent = get_session(store, session_id)
        child = create_session(store, parent.cwd, parent_id=session_id, guard=guard)
        try:
            start_turn(
                store, dispatcher, child.session_id, args.prompt, source="subagent", guard=guard
            )
        except SessionArchived as exc:
            # Archived since its creation: on its own (run_tool settles the call failed), or
            # with this turn's lineage (then this turn no longer runs and nothing is recorded).
            raise _SubagentArchived(child.session_id) from exc
        return "completed", f"started subagent {child.session_id}"
    assert isinstance(args, SetReminderArgs)
    rid = create_reminder(store, session_id, args.seconds, args.prompt, guard=guard)
    return "completed", f"stored reminder {rid}"
