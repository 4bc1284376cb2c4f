"""Turns: a chain of model steps, one ``turn.step`` task per step.

Lifecycle (``TurnState``; ``TRANSITIONS`` is the table every write follows)::

    queued ──► running ──► completed | failed | blocked
       │          │
       │          └──► cancelling ──► cancelled
       └──────────────────────────────► cancelled | blocked

One turn runs at a time per session; later prompts queue behind it. Every step asks the gate
before its model request; a refused step ends the turn ``blocked`` with no model request.
A stop names the turns it stops, so a late stop never touches the next turn. A step in flight
holds a short lease (``Keys.step_lease``) that it refreshes while it works; a stop of a turn
with a step in flight marks it ``cancelling`` and the step settles it as ``cancelled``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from orchestrator import events, metrics
from orchestrator.activity import shorten
from orchestrator.errors import InvalidParams, SessionArchived, SessionNotFound
from orchestrator.families import Dispatcher, send_step
from orchestrator.gate import StepRefused, admit
from orchestrator.model import Model, ModelAction, ModelError, StepRequest, prompt_lines
from orchestrator.sessions import SESSION_ID_RE, check_session_id, check_utf8
from orchestrator.store import Store, iso, new_id, now_ms, retried
from orchestrator.titles import generated_title, set_title

log = logging.getLogger(__name__)

#: Largest prompt accepted, in characters.
MAX_PROMPT = 100_000
#: A step's lease lasts this long unless refreshed (ms); refreshed every ``_REFRESH`` s.
STEP_LEASE_MS = 5_000
_REFRESH = 1.0
#: How often a step in flight looks for a stop (seconds).
CANCEL_POLL = 0.05


class TurnState(StrEnum):
    """Where a turn is in its lifecycle."""

    QUEUED = "queued"  #: waiting behind the session's running turn
    RUNNING = "running"  #: its steps are being dispatched and run
    CANCELLING = "cancelling"  #: stopped while a step was in flight; the step settles it
    COMPLETED = "completed"  #: every step ran (stopReason end_turn)
    CANCELLED = "cancelled"  #: stopped by a user cancel or an archive
    BLOCKED = "blocked"  #: a step was refused by the gate; no model request was made
    FAILED = "failed"  #: the model or a tool failed


TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    TurnState.QUEUED: frozenset({TurnState.RUNNING, TurnState.CANCELLED, TurnState.BLOCKED}),
    TurnState.RUNNING: frozenset(
        {
            TurnState.CANCELLING,
            TurnState.CANCELLED,
            TurnState.COMPLETED,
            TurnState.BLOCKED,
            TurnState.FAILED,
        }
    ),
    TurnState.CANCELLING: frozenset({TurnState.CANCELLED}),
    TurnState.COMPLETED: frozenset(),
    TurnState.CANCELLED: frozenset(),
    TurnState.BLOCKED: frozenset(),
    TurnState.FAILED: frozenset(),
}

LIVE_STATES = frozenset({TurnState.QUEUED, TurnState.RUNNING, TurnState.CANCELLING})

#: ACP ``stopReason`` for each terminal state.
STOP_REASON = {
    TurnState.COMPLETED: "end_turn",
    TurnState.CANCELLED: "cancelled",
    TurnState.BLOCKED: "cancelled",
    TurnState.FAILED: "end_turn",  # the error is in the turn's last message
}


def sources_of(target: TurnState) -> str:
    """Comma list of the states allowed to move to ``target`` (for the Lua scripts)."""
    return ",".join(s.value for s, to in TRANSITIONS.items() if target in to)


@dataclass(frozen=True)
class Turn:
    """A stored turn."""

    turn_id: str
    session_id: str
    state: TurnState
    prompt: str
    source: str
    step: int
    stop_reason: str
    error: str

    def to_wire(self) -> dict[str, object]:
        """``{"turnId", "sessionId", "state", "source", "step", "stopReason"?, "error"?}``."""
        out: dict[str, object] = {
            "turnId": self.turn_id,
            "sessionId": self.session_id,
            "state": self.state.value,
            "source": self.source,
            "step": self.step,
        }
        if self.stop_reason:
            out["stopReason"] = self.stop_reason
        if self.error:
            out["error"] = self.error
        return out


@retried
def get_turn(store: Store, turn_id: str) -> Turn | None:
    """The stored turn, or ``None`` (also for a malformed id, which never reaches a key
    name: turn ids share the session id alphabet)."""
    if not isinstance(turn_id, str) or not SESSION_ID_RE.fullmatch(turn_id):
        return None
    h: dict[str, str] = store.redis.hgetall(store.keys.turn(turn_id))
    if not h:
        return None
    return Turn(
        h["turnId"],
        h["sessionId"],
        TurnState(h["state"]),
        h.get("prompt", ""),
        h.get("source", ""),
        int(h.get("step", "0")),
        h.get("stopReason", ""),
        h.get("error", ""),
    )


def record_update(store: Store, session_id: str, update: dict[str, object]) -> None:
    """Append an ACP ``session/update`` payload to the conversation and publish it."""
    store.redis.rpush(store.keys.history(session_id), json.dumps(update))
    events.publish(store, "update", session_id, update=update)


def start_turn(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    prompt: str,
    *,
    source: str = "prompt",
    reminder_id: str = "",
) -> str:
    """Store a turn for ``prompt`` and dispatch its first step if the session is idle.

    ``source`` is ``prompt`` (a user), ``reminder``, ``subagent`` (a spawned child's first
    turn) or ``subagent_result`` (a child finished). A user prompt on an archived lineage is
    refused up front; the others are stored and their first step meets the gate, so a late
    wake-up runs nothing. Returns the turn id.

    With ``reminder_id`` (a reminder's fire) the turn is created at most once per reminder,
    in the script that spends it (``reminders`` module): a repeat fire returns the turn the
    first one created (and sends its first step again if it may not have been sent: the
    step itself drops duplicates), a fire of a reminder a stop deleted returns ``""`` and
    creates nothing, and one under an archived lineage raises ``SessionArchived`` with
    nothing stored (the reminder is marked ``refused``).
    Raises ``InvalidParams`` (prompt not a string or too long), ``SessionNotFound``,
    ``SessionArchived``, ``StoreUnavailable``.
    """
    sid = check_session_id(session_id)
    if not isinstance(prompt, str):
        raise InvalidParams("prompt must be a string.", {"param": "prompt"})
    if len(prompt) > MAX_PROMPT:
        raise InvalidParams(f"prompt is longer than {MAX_PROMPT} characters.", {"param": "prompt"})
    check_utf8(prompt, "prompt")
    tid = new_id("turn")
    ms = now_ms()
    label = shorten(prompt)
    refuse = "1" if source == "prompt" else "0"
    result = store.run(
        "turn_create", [sid, tid, prompt, label, source, ms, iso(ms), refuse, reminder_id]
    )
    if result[0] in ("duplicate", "stopped"):
        return _repeated_fire(store, dispatcher, sid, reminder_id, result)
    if result[0] == "not_found":
        raise SessionNotFound(sid)
    if result[0] == "archived":
        raise SessionArchived(sid)
    record_update(
        store,
        sid,
        {
            "sessionUpdate": "user_message_chunk",
            "turnId": tid,
            "content": {"type": "text", "text": prompt},
        },
    )
    log.info("turn %s %s (%s)", tid, result[0], source, extra={"session_id": sid, "turn_id": tid})
    if result[0] == "run":
        send_step(dispatcher, sid, tid, 0)
    return tid


def _repeated_fire(
    store: Store, dispatcher: Dispatcher, sid: str, reminder_id: str, result: list[str]
) -> str:
    """A reminder fire that created nothing: ``{'stopped'}`` (a stop deleted the reminder)
    returns ``""``; ``{'duplicate', turnId}`` returns that turn, whose first step is sent
    again while it may be lost (running, at step 0: ``turn_begin_step`` drops a copy of a
    step that is in flight or already ran)."""
    tid = str(result[1]) if result[0] == "duplicate" else ""
    log.info(
        "reminder %s fired before (turn %s) or stopped",
        reminder_id,
        tid or "none",
        extra={"session_id": sid, "family": "reminder"},
    )
    turn = get_turn(store, tid) if tid else None
    if turn is not None and turn.state is TurnState.RUNNING and turn.step == 0:
        send_step(dispatcher, sid, tid, 0)
    return tid


def finish(
    store: Store, dispatcher: Dispatcher, turn_id: str, state: TurnState, error: str = ""
) -> bool:
    """Move a turn to a terminal ``state`` if the table allows it from where it is; start the
    session's next queued turn. Returns whether the turn moved."""
    ms = now_ms()
    result = store.run(
        "turn_finish",
        [turn_id, state.value, STOP_REASON[state], error, ms, iso(ms), sources_of(state)],
    )
    if result[0] != "finished":
        return False
    turn = get_turn(store, turn_id)
    if turn is not None:
        events.publish(
            store,
            "turn",
            turn.session_id,
            turnId=turn_id,
            state=state.value,
            stopReason=STOP_REASON[state],
        )
        log.info(
            "turn %s ended %s%s",
            turn_id,
            state.value,
            f": {error}" if error else "",
            extra={"session_id": turn.session_id, "turn_id": turn_id},
        )
        if result[1]:
            send_step(dispatcher, turn.session_id, result[1], 0)
    return True


def cancel_turns(
    store: Store, dispatcher: Dispatcher, session_id: str, turn_ids: list[str]
) -> dict[str, str]:
    """Stop exactly the named turns of a session (the user's cancel path). Queued turns are
    discarded (logged), a turn between steps ends ``cancelled``, a turn with a step in flight
    becomes ``cancelling`` and its step settles it. Returns ``{turnId: outcome}``."""
    if not turn_ids:
        return {}
    ms = now_ms()
    flat = store.run("turn_cancel", [ms, iso(ms), *turn_ids])
    outcomes: dict[str, str] = {}
    for tid, outcome in zip(flat[::2], flat[1::2], strict=True):
        if outcome == "promoted":
            send_step(dispatcher, session_id, tid, 0)
            continue
        outcomes[tid] = outcome
        extra = {"session_id": session_id, "turn_id": tid}
        if outcome == "cancelled":
            log.info("turn %s cancelled", tid, extra=extra)
            events.publish(
                store,
                "turn",
                session_id,
                turnId=tid,
                state="cancelled",
                stopReason=STOP_REASON[TurnState.CANCELLED],
            )
        elif outcome == "cancelling":
            log.info("turn %s cancelling (a step is in flight)", tid, extra=extra)
        else:
            log.info("turn %s not cancelled: already %s", tid, outcome, extra=extra)
    return outcomes


def cancel_session_turns(store: Store, dispatcher: Dispatcher, session_id: str) -> dict[str, str]:
    """Stop every live turn of a session, running and queued (queued input is discarded).
    Raises ``SessionNotFound`` for a malformed id (it never reaches a key name)."""
    sid = check_session_id(session_id)
    tids: list[str] = store.redis.zrange(store.keys.live_turns(sid), 0, -1)
    return cancel_turns(store, dispatcher, sid, tids)


class _StepWatch:
    """Keeps a step's lease alive and sets ``cancel`` once the turn stops running."""

    def __init__(self, store: Store, turn_id: str) -> None:
        self.store = store
        self.turn_id = turn_id
        self.cancel = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{turn_id}", daemon=True)

    def __enter__(self) -> _StepWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        k = self.store.keys
        since_refresh = 0.0
        while not self._done.wait(CANCEL_POLL):
            try:
                state = self.store.redis.hget(k.turn(self.turn_id), "state")
                since_refresh += CANCEL_POLL
                if since_refresh >= _REFRESH:
                    self.store.redis.pexpire(k.step_lease(self.turn_id), STEP_LEASE_MS)
                    since_refresh = 0.0
            except Exception as exc:  # a blip must not kill the watch; the lease outlives it
                log.debug("step watch of %s: %s", self.turn_id, exc)
                continue
            if state != TurnState.RUNNING.value:
                self.cancel.set()
                return


#: Runs a tool call: (store, dispatcher, session id, turn id, action, cancel) -> result text.
ToolRunner = Callable[[Store, Dispatcher, str, str, ModelAction, threading.Event], str]


def run_step(
    store: Store,
    dispatcher: Dispatcher,
    model: Model,
    tools: ToolRunner,
    session_id: str,
    turn_id: str,
    index: int,
) -> str:
    """Run step ``index`` of a turn: gate, model request, tool call, then dispatch the next
    step or end the turn. Safe to run twice for the same step (a redelivery): a step that
    already ran is dropped as ``stale``.

    Returns the outcome: ``ran``, ``completed``, ``refused``, ``cancelled``, ``failed``,
    ``stale`` or the turn's state when it was no longer running. Raises ``StoreUnavailable``
    when Redis cannot be read (the caller retries the step later; nothing ran).
    """
    extra = {"session_id": session_id, "turn_id": turn_id}
    # The gate first: if Redis cannot answer, StoreUnavailable propagates before anything
    # (even the step's lease) is written, and the retried step starts clean.
    try:
        admit(store, session_id)
    except StepRefused as refused:
        finish(store, dispatcher, turn_id, TurnState.BLOCKED, f"gate: {refused.reason}")
        metrics.incr(store, metrics.GATE_REFUSALS, refused.reason)
        log.info(
            "step %d of turn %s refused by the gate (%s %s)",
            index,
            turn_id,
            refused.reason,
            refused.holder or "",
            extra=extra,
        )
        return "refused"
    began = store.run("turn_begin_step", [turn_id, index, STEP_LEASE_MS])
    if began != "ok":
        if began == TurnState.CANCELLING.value:
            finish(store, dispatcher, turn_id, TurnState.CANCELLED)
        log.info("step %d of turn %s dropped: %s", index, turn_id, began, extra=extra)
        return str(began)

    turn = get_turn(store, turn_id)
    if turn is None:
        return "missing"
    if index == 0 and turn.source == "prompt":
        _generate_title(store, session_id, turn.prompt)
    lines = prompt_lines(turn.prompt)
    total = max(1, len(lines))
    with _StepWatch(store, turn_id) as watch:
        store.redis.rpush(
            store.keys.model_requests(session_id),
            json.dumps({"turnId": turn_id, "step": index, "at": iso(now_ms())}),
        )
        try:
            action = model.step(StepRequest(session_id, turn_id, index, lines), watch.cancel)
            if watch.cancel.is_set():
                result = None
            elif action.kind == "tool":
                result = tools(store, dispatcher, session_id, turn_id, action, watch.cancel)
            else:
                record_update(
                    store,
                    session_id,
                    {
                        "sessionUpdate": "agent_message_chunk",
                        "turnId": turn_id,
                        "content": {"type": "text", "text": action.text},
                    },
                )
                result = action.text
        except ModelError as exc:
            record_update(
                store,
                session_id,
                {
                    "sessionUpdate": "agent_message_chunk",
                    "turnId": turn_id,
                    "content": {"type": "text", "text": f"error: {exc}"},
                },
            )
            finish(store, dispatcher, turn_id, TurnState.FAILED, str(exc))
            return "failed"
        cancelled = watch.cancel.is_set()
    if cancelled:
        finish(store, dispatcher, turn_id, TurnState.CANCELLED)
        return "cancelled"
    if index + 1 < total:
        advanced = store.run("turn_advance", [turn_id, index + 1])
        if advanced == "ok":
            send_step(dispatcher, session_id, turn_id, index + 1)
            return "ran"
        finish(store, dispatcher, turn_id, TurnState.CANCELLED)
        return "cancelled"
    if not finish(store, dispatcher, turn_id, TurnState.COMPLETED):
        finish(store, dispatcher, turn_id, TurnState.CANCELLED)
        return "cancelled"
    _after_completion(store, dispatcher, turn, result)
    return "completed"


def _generate_title(store: Store, session_id: str, prompt: str) -> None:
    """An untitled session gets a title from its first prompt. The write is discarded if a
    client set a title meanwhile (checked atomically by ``titles.set_title``)."""
    if store.redis.hget(store.keys.session(session_id), "title"):
        return
    title = generated_title(prompt)
    if title:
        set_title(store, session_id, title, source="generated")


def _after_completion(store: Store, dispatcher: Dispatcher, turn: Turn, result: str | None) -> None:
    """A subagent's finished turn wakes its parent with a short report (a turn of its own,
    which meets the gate like any other)."""
    if turn.source != "subagent":
        return
    parent: str | None = store.redis.hget(store.keys.session(turn.session_id), "parentId")
    if not parent:
        return
    report = f"say subagent {turn.session_id} finished"
    try:
        start_turn(store, dispatcher, parent, report, source="subagent_result")
    except (SessionNotFound, SessionArchived) as exc:
        log.info(
            "parent %s not woken: %s", parent, exc.message, extra={"session_id": turn.session_id}
        )
