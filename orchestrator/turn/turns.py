"""Turns: a chain of model steps, one ``turn.step`` task per step.

Lifecycle (``TurnState``; ``TRANSITIONS`` is the table every write follows; both with the
stored ``Turn`` in ``orchestrator/turn/turn_state.py``)::

    queued ──► running ──► completed | failed | blocked
       │          │
       │          └──► cancelling ──► cancelled
       └──────────────────────────────► cancelled | blocked

One turn runs at a time per session; later prompts queue behind it. Every step asks the gate
in the script that begins it (``turn_begin_step.lua``), so no step is admitted once an archive
commits; a refused step ends the turn ``blocked`` with no model request. A stop names the turns
it stops, so a late stop never touches the next turn; an archive stops its lineage's turns in
its own script. A step in flight holds a short lease (``Keys.step_lease``) that it refreshes
while it works; a stop of a turn with a step in flight marks it ``cancelling`` and the step,
which polls the turn's state (``orchestrator/turn/steps.py``), settles it as ``cancelled``. Every
write a
step makes (its conversation updates, its tool launches, the turn's advance and end) is
conditional on its turn still ``running`` and on that copy of the step still owning it (a
fencing token, ``orchestrator/session/fencing.py``), so nothing a stopped step does lands after the
stop, and a copy superseded by another (its worker froze past its lease) lands nothing. A
turn's prompt enters the conversation when its first step is admitted: a prompt that never
ran never reads as said.
"""

from __future__ import annotations

import json
import logging

from orchestrator.errors import (
    IdempotencyKeyReused,
    InvalidParams,
    SessionNotFound,
    StepSuperseded,
    TurnStopped,
)
from orchestrator.families.base import Dispatcher, Family, send_step
from orchestrator.items import ActivityItem, shorten
from orchestrator.session.fencing import StepGuard
from orchestrator.session.sessions import archived_refusal, check_session_id, check_utf8
from orchestrator.storage import audit, events, idempotency, metrics
from orchestrator.storage.store import Store, iso, new_id, retried
from orchestrator.turn import scripts
from orchestrator.turn.turn_state import CANCELLED_BY_ARCHIVE as CANCELLED_BY_ARCHIVE
from orchestrator.turn.turn_state import CANCELLED_BY_DELETE as CANCELLED_BY_DELETE
from orchestrator.turn.turn_state import LIVE_STATES as LIVE_STATES
from orchestrator.turn.turn_state import STOP_REASON as STOP_REASON
from orchestrator.turn.turn_state import TRANSITIONS as TRANSITIONS
from orchestrator.turn.turn_state import Turn as Turn
from orchestrator.turn.turn_state import TurnState as TurnState
from orchestrator.turn.turn_state import get_turn as get_turn
from orchestrator.turn.turn_state import sources_of as sources_of

log = logging.getLogger(__name__)

#: Largest prompt accepted, in characters.
MAX_PROMPT = 100_000


def record_update(
    store: Store,
    session_id: str,
    update: dict[str, object],
    *,
    settle: bool = False,
    token: str = "",
) -> bool:
    """Append an ACP ``session/update`` payload of a turn (its ``turnId``) to the session's
    conversation and publish it, only while that turn runs (``turn_record.lua``) and, with
    ``token`` (a step's write), while that copy of the step owns it
    (``orchestrator/session/fencing.py``).
    With ``settle`` (an in-flight tool call settling as cancelled) a ``cancelling`` turn may
    still write, never into an archived session. ``session_id`` is the turn's session: the
    script publishes the update there as it appends it. Returns whether it was appended.
    Raises ``StepSuperseded`` (another copy of the step began), ``StoreUnavailable``."""
    tid = str(update.get("turnId", ""))
    appended = scripts.turn_record(
        store, turn_id=tid, update_json=json.dumps(update), settle=settle, token=token
    )
    if appended is scripts.Recorded.SUPERSEDED:
        raise StepSuperseded(tid)
    return appended is scripts.Recorded.APPENDED


def start_turn(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    prompt: str,
    *,
    source: str = "prompt",
    guard: StepGuard | None = None,
    reminder_id: str = "",
    idempotency_key: str | None = None,
) -> str:
    """Store a turn for ``prompt`` and dispatch its first step if the session is idle.

    ``source`` is ``prompt`` (a user), ``reminder``, ``subagent`` (a spawned child's first
    turn) or ``subagent_result`` (a child finished). Whatever the source, a turn on an archived
    lineage is refused atomically (``turn_create.lua``): nothing is stored and the
    conversation and ``updatedAt`` stay as the archive left them; a refused wake-up (any
    source but ``prompt``) is audited (``wakeup``/``refused``) and counted
    (``fleet_wakeups_refused``). With ``guard`` (the copy of a step spawning a subagent)
    nothing is stored once its turn no longer runs or that copy no longer owns the step. The
    prompt enters the conversation when the first step is admitted. A first step that cannot
    be sent is logged (the turn is stored ``running``; a sweeper re-dispatches it). Returns
    the turn id.

    With ``reminder_id`` (a reminder's fire) the turn is created at most once per reminder,
    in the script that spends it (``reminders`` module): a repeat fire returns the turn the
    first one created (and sends its first step again if it may not have been sent: the
    step itself drops duplicates), a fire of a reminder a stop deleted returns ``""`` and
    creates nothing, and one under an archived lineage raises ``SessionArchived`` with
    nothing stored (the reminder is marked ``refused``).

    With ``idempotency_key`` (a client's, scoped to the session;
    ``orchestrator/storage/idempotency.py``)
    the key is recorded with the turn in the script that stores it: a retry with it returns
    the turn the first stored and stores nothing (its first step is sent again while it may
    be lost, as for a repeated reminder fire). Raises also ``InvalidIdempotencyKey``,
    ``IdempotencyKeyReused`` (the key came with another prompt) and ``WriteOutcomeUnknown``
    (the reply was lost: the turn may have been stored, and then runs).
    Raises ``InvalidParams`` (prompt not a string, too long, or, from a person (``source``
    ``prompt``), empty or only whitespace), ``SessionNotFound``,
    ``SessionArchived``, ``TurnStopped``, ``StoreUnavailable``.
    """
    sid = check_session_id(session_id)
    _check_prompt(prompt, source)
    idem = idempotency.for_request(store, idempotency_key, prompt)
    tid = new_id("turn")
    with idempotency.outcome_unknown(*_OUTCOME, keyed=idem is not None):
        # The script reads the server's clock itself (no nowMs, nowIso).
        result = scripts.turn_create(
            store,
            session_id=sid,
            turn_id=tid,
            prompt=prompt,
            label=shorten(prompt),
            source=source,
            guard=guard,
            reminder_id=reminder_id,
            idempotency=idem,
        )
    if isinstance(result, scripts.KeyReused):
        raise IdempotencyKeyReused("prompt")
    if isinstance(result, scripts.Replay):
        # The first request may have lost its reply before it sent the first step.
        with idempotency.written(*_OUTCOME, keyed=True):
            return _send_first_step_again(store, dispatcher, sid, result.turn_id)
    if reminder_id and isinstance(result, scripts.Duplicate | scripts.Stopped):
        return _repeated_fire(store, dispatcher, sid, reminder_id, result)
    if not isinstance(result, scripts.Stored):
        _refused(store, sid, source, guard, result)
        return tid  # a duplicate without a reminder: never replied
    extra = {"session_id": sid, "turn_id": tid}
    log.info("turn %s %s (%s)", tid, result.outcome, source, extra=extra)
    if result.outcome == "run":
        try:
            send_step(dispatcher, sid, tid, 0)
        except Exception as exc:  # the turn is stored whole; the sweeper re-sends lost steps
            log.warning("first step of turn %s not sent: %s", tid, exc, extra=extra)
    return tid


#: What a prompt whose reply was lost may have done (``idempotency.outcome_unknown``).
_OUTCOME = (
    "prompt",
    "the session's activity lists a turn it stored while the turn is live, and its "
    "conversation holds the prompt once the turn began",
)


def _check_prompt(prompt: object, source: str) -> None:
    """Raises ``InvalidParams`` for a prompt ``start_turn`` refuses (not a string, too long,
    empty from a person, not UTF-8)."""
    if not isinstance(prompt, str):
        raise InvalidParams("prompt must be a string.", {"param": "prompt"})
    if len(prompt) > MAX_PROMPT:
        raise InvalidParams(f"prompt is longer than {MAX_PROMPT} characters.", {"param": "prompt"})
    if source == "prompt" and not prompt.strip():
        raise InvalidParams("prompt is empty: give the text of the turn.", {"param": "prompt"})
    check_utf8(prompt, "prompt")


def _refused(
    store: Store, sid: str, source: str, guard: StepGuard | None, result: scripts.Created
) -> None:
    """Raises what ``turn_create``'s refusal ``result`` means (``SessionNotFound``,
    ``TurnStopped``, ``SessionArchived``: a refused wake-up is audited and counted); returns
    for a reply that is no refusal."""
    if isinstance(result, scripts.SessionMissing):
        raise SessionNotFound(sid)
    if isinstance(result, scripts.Stopped):
        raise TurnStopped(StepGuard.argv(guard)[0])
    if isinstance(result, scripts.Archived):
        if source != "prompt":
            metrics.incr(store, metrics.WAKEUPS_REFUSED, source)
            audit.record(store, sid, "wakeup", "refused", source=source, archivedBy=result.holder)
        raise archived_refusal(store, sid)


def _repeated_fire(
    store: Store,
    dispatcher: Dispatcher,
    sid: str,
    reminder_id: str,
    result: scripts.Duplicate | scripts.Stopped,
) -> str:
    """A reminder fire that created nothing: ``Stopped`` (a stop deleted the reminder)
    returns ``""``; ``Duplicate`` returns its turn, whose first step is sent again while it
    may be lost (running, at step 0: ``turn_begin_step`` drops a copy of a step that is in
    flight or already ran)."""
    tid = result.turn_id if isinstance(result, scripts.Duplicate) else ""
    log.info(
        "reminder %s fired before (turn %s) or stopped",
        reminder_id,
        tid or "none",
        extra={"session_id": sid, "family": "reminder"},
    )
    return _send_first_step_again(store, dispatcher, sid, tid) if tid else tid


def _send_first_step_again(store: Store, dispatcher: Dispatcher, sid: str, tid: str) -> str:
    """Send the first step of turn ``tid`` again if it may be lost (running, at step 0:
    ``turn_begin_step`` drops a copy of a step that is in flight or already ran); return
    ``tid``."""
    turn = get_turn(store, tid)
    if turn is not None and turn.state is TurnState.RUNNING and turn.step == 0:
        send_step(dispatcher, sid, tid, 0)
    return tid


def announce_end(
    store: Store,
    session_id: str,
    turn_id: str,
    state: TurnState,
    error: str,
    stop_reason: str = "",
) -> None:
    """Publish and log that a turn ended in ``state`` (``stop_reason``: ACP's, the state's
    own by default): the ``turn`` event ``{"turnId", "state", "stopReason"}`` (null for a
    failed turn)."""
    reason = None if state is TurnState.FAILED else stop_reason or STOP_REASON[state]
    events.publish(store, "turn", session_id, turnId=turn_id, state=state.value, stopReason=reason)
    _log_end(session_id, turn_id, state, error)


def _log_end(session_id: str, turn_id: str, state: TurnState, error: str) -> None:
    log.info(
        "turn %s ended %s%s",
        turn_id,
        state.value,
        f": {error}" if error else "",
        extra={"session_id": session_id, "turn_id": turn_id},
    )


def finish(
    store: Store,
    dispatcher: Dispatcher,
    turn_id: str,
    state: TurnState,
    error: str = "",
    *,
    token: str = "",
    stop_reason: str = "",
    said: str = "",
) -> bool:
    """Move a turn to a terminal ``state`` if the table allows it from where it is; start the
    session's next queued turn. ``stop_reason`` is the ACP ``stopReason`` stored (the
    state's own, ``STOP_REASON``, by default: a model may end a completed turn with
    ``max_tokens``, ``max_turn_requests`` or ``refusal``). With ``token`` (a step ending its
    own turn) only the copy of the step that owns it may (``orchestrator/session/fencing.py``), and
    ``said`` (the JSON of an update: the step's last words) lands in the conversation with
    the end. The ``turn`` event (``announce_end``) is published by the script that ends it.
    Returns whether the turn moved.
    Raises ``StepSuperseded`` (another copy of the step began), ``StoreUnavailable``."""
    reason = stop_reason or STOP_REASON[state]
    result = scripts.turn_finish(
        store,
        turn_id=turn_id,
        state=state,
        stop_reason=reason,
        error=error,
        allowed_from=sources_of(state),
        token=token,
        stream_max=events.STREAM_MAXLEN,
        said=said,
    )
    if isinstance(result, scripts.Superseded):
        raise StepSuperseded(turn_id)
    if not isinstance(result, scripts.Finished):
        return False
    sid = result.session_id
    _log_end(sid, turn_id, state, error)
    if result.promoted:
        send_step(dispatcher, sid, result.promoted, 0)
    return True


def cancel_turns(
    store: Store, dispatcher: Dispatcher, session_id: str, turn_ids: list[str]
) -> dict[str, str]:
    """Stop exactly the named turns of a session (the user's cancel path). Queued turns are
    discarded (logged), a turn between steps ends ``cancelled``, a turn with a step in flight
    becomes ``cancelling`` and its step settles it; a turn that has ended is left alone, and
    one of another session (or none) answers ``missing``. Returns ``{turnId: outcome}``."""
    if not turn_ids:
        return {}
    ms = store.now_ms()
    cancelled = scripts.turn_cancel(
        store,
        now_ms=ms,
        now_iso=iso(ms),
        session_id=session_id,
        turn_ids=[*dict.fromkeys(turn_ids)],
    )
    ended = cancelled.ended
    outcomes: dict[str, str] = {}
    for tid, outcome in cancelled.outcomes:
        if outcome == "promoted":
            send_step(dispatcher, session_id, tid, 0)
            continue
        outcomes[tid] = outcome
        extra = {"session_id": session_id, "turn_id": tid}
        if tid in ended:  # cancelled here: announced once, here
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


def cancel_session_turns(
    store: Store, dispatcher: Dispatcher, session_id: str, turn_ids: list[str] | None = None
) -> dict[str, str]:
    """Stop the named turns of a session, or without ``turn_ids`` every turn live when it is
    called, running and queued (queued input is discarded); a turn that starts afterwards is
    never touched. Returns ``{turnId: outcome}`` (``cancel_turns``). Raises
    ``SessionNotFound`` for a malformed id (it never reaches a key name)."""
    sid = check_session_id(session_id)
    if turn_ids is None:
        turn_ids = _live_turn_ids(store, sid)
    return cancel_turns(store, dispatcher, sid, turn_ids)


@retried
def _live_turn_ids(store: Store, session_id: str) -> list[str]:
    found: list[str] = store.redis.zrange(store.keys.live_turns(session_id), 0, -1)
    return found


def stopped_by_archive(
    store: Store,
    session_id: str,
    flat: list[str],
    *,
    publish: bool = True,
    collect: list[tuple[str, str, dict[str, object]]] | None = None,
) -> list[ActivityItem]:
    """What an archive of ``session_id`` stopped in its own script (``stop_turns_for_archive``
    in ``_lib.lua``: a flat list tid, sid, fromState, toState, label, settlement), as the
    census would have named it: a turn item per turn of the session itself (labelled with the
    state it was stopped in) and one ``subagent`` item per descendant whose turns it stopped.
    The tool-call settlement the script wrote (JSON, or ``''``) is published as an update, and
    a turn event for each turn that ended there (a ``cancelling`` one is settled by its step),
    unless ``publish`` is false (the script emitted them itself: ``archive.lua``); with
    ``collect`` they are appended there for the caller to publish with others (a bulk batch).
    """
    items: list[ActivityItem] = []
    descendants: dict[str, list[ActivityItem]] = {}
    ended: list[tuple[str, str, dict[str, object]]] = []
    for i in range(0, len(flat), 6):
        tid, sid, before, after, label, settlement = flat[i : i + 6]
        if settlement:
            ended.append(("update", sid, {"update": json.loads(settlement)}))
        item = ActivityItem(Family.TURN, tid, f'turn "{label}" ({before})', sid)
        if sid == session_id:
            items.append(item)
        else:
            descendants.setdefault(sid, []).append(item)
        if after == TurnState.CANCELLED.value:
            reason = STOP_REASON[TurnState.CANCELLED]
            ended.append(("turn", sid, {"turnId": tid, "state": after, "stopReason": reason}))
        log.info("turn %s %s by the archive", tid, after, extra={"session_id": sid, "turn_id": tid})
    for sid, turns in descendants.items():
        n = len(turns)
        label = f"subagent {sid} ({n} turn{'s' if n > 1 else ''} stopped by the archive)"
        items.append(ActivityItem(Family.SUBAGENT, sid, label, sid, parts=tuple(turns)))
    if collect is not None:
        collect.extend(ended)
    elif publish:
        events.publish_many(store, ended)
    return items
