"""Turns: start one with a prompt, read one, and cancel a session's turns (``cancel``, or
``close`` as ACP session/close does)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import AUTH, DispatcherDep, StoreDep
from api.routes.bodies import (
    IDEMPOTENT_RESPONSES,
    MAX_TURN_IDS,
    CancelBody,
    IdempotencyKeyDep,
    PromptBody,
)
from orchestrator.errors import InvalidParams, TurnNotFound
from orchestrator.families import Dispatcher
from orchestrator.session import sessions
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from orchestrator.turn import turns

router = APIRouter(dependencies=AUTH, tags=["turns"])


@router.post("/sessions/{session_id}/prompt", status_code=202, responses=IDEMPOTENT_RESPONSES)
def prompt(
    session_id: str,
    body: PromptBody,
    store: StoreDep,
    dispatcher: DispatcherDep,
    idempotency_key: IdempotencyKeyDep,
) -> dict[str, Any]:
    """Start a turn (it queues behind a running one). 409 if the session is archived. With
    ``Idempotency-Key`` (scoped to the session), a retry answers 202 with the turn the first
    request started, and starts none."""
    tid = turns.start_turn(
        store, dispatcher, session_id, body.prompt, idempotency_key=idempotency_key
    )
    return {"sessionId": session_id, "turnId": tid}


@router.get("/turns/{turn_id}")
def get_turn(turn_id: str, store: StoreDep) -> dict[str, Any]:
    """A turn's state. 404 ``turn_not_found`` for an unknown or malformed id."""
    turn = turns.get_turn(store, turn_id) if sessions.SESSION_ID_RE.fullmatch(turn_id) else None
    if turn is None:
        raise TurnNotFound(turn_id)
    return turn.to_wire()


def _cancel(
    store: Store, dispatcher: Dispatcher, session_id: str, body: CancelBody | None
) -> dict[str, str]:
    sessions.get_session(store, session_id)
    named = body.turnIds if body is not None else None
    if named is None:
        return turns.cancel_session_turns(store, dispatcher, session_id)
    if len(named) > MAX_TURN_IDS:
        raise InvalidParams(f"turnIds names more than {MAX_TURN_IDS} turns.", {"param": "turnIds"})
    return turns.cancel_session_turns(store, dispatcher, session_id, named)


@router.post("/sessions/{session_id}/close")
def close(
    session_id: str, store: StoreDep, dispatcher: DispatcherDep, body: CancelBody | None = None
) -> dict[str, Any]:
    """Close the session as ACP session/close does: its live turns (or the ``turnIds``
    named) are cancelled (a queued prompt is discarded, a step in flight ends
    ``cancelling`` then ``cancelled``); ``turns`` answers each with its outcome. Jobs,
    reminders and subagents keep running; archive with ``stopActivity`` for those."""
    cancelled = _cancel(store, dispatcher, session_id, body)
    audit.record(store, session_id, "close", "closed", cancelledTurns=len(cancelled))
    return {"sessionId": session_id, "closed": True, "turns": cancelled}


@router.post("/sessions/{session_id}/cancel")
def cancel(
    session_id: str, store: StoreDep, dispatcher: DispatcherDep, body: CancelBody | None = None
) -> dict[str, Any]:
    """Cancel the turns named in ``turnIds``, or without it the turns live when the
    request arrives; ``turns`` maps each to ``cancelled``, ``cancelling`` (a step in
    flight settles it), its end state (it had ended: nothing was stopped) or
    ``missing`` (not a turn of this session)."""
    return {"sessionId": session_id, "turns": _cancel(store, dispatcher, session_id, body)}
