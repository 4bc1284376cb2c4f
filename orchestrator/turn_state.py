"""What a turn is: its states, the transitions every write follows, and its stored record.

``orchestrator/turns.py`` (the lifecycle) and the step runtime act on them; the Lua scripts take
the transition table through ``sources_of``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from orchestrator.sessions import SESSION_ID_RE
from orchestrator.store import Store, retried
from orchestrator.usage import usage_of


class TurnState(StrEnum):
    """Where a turn is in its lifecycle."""

    QUEUED = "queued"  #: waiting behind the session's running turn
    RUNNING = "running"  #: its steps are being dispatched and run
    CANCELLING = "cancelling"  #: stopped while a step was in flight; the step settles it
    COMPLETED = "completed"  #: the model ended it (stopReason end_turn, max_tokens, ...)
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

#: A turn's ``cancelledBy`` when an archive of its session (or of an ancestor) stopped it
#: (written by ``stop_turns_for_archive`` in ``_lib.lua``). ACP's ``stopReason`` stays
#: ``cancelled``: this says why, for clients that show it (``fleet prompt``).
CANCELLED_BY_ARCHIVE = "archive"
#: ... when the archive was a delete's (``deletion.delete`` with ``stop_activity``).
CANCELLED_BY_DELETE = "delete"

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
    #: Model tokens of its steps: ``{"inputTokens", "outputTokens"}``.
    usage: dict[str, int] = field(default_factory=lambda: {"inputTokens": 0, "outputTokens": 0})
    #: What stopped it, when not its own end or a user's cancel: ``CANCELLED_BY_ARCHIVE`` or
    #: ``CANCELLED_BY_DELETE``.
    cancelled_by: str = ""

    def to_wire(self) -> dict[str, object]:
        """``{"turnId", "sessionId", "state", "source", "step", "usage", "stopReason"?,
        "error"?, "cancelledBy"?}``; ``stopReason`` is null for a failed turn;
        ``cancelledBy`` is ``archive`` for a turn its session's (or an ancestor's) archive
        stopped, ``delete`` when that archive was a delete's."""
        out: dict[str, object] = {
            "turnId": self.turn_id,
            "sessionId": self.session_id,
            "state": self.state.value,
            "source": self.source,
            "step": self.step,
            "usage": dict(self.usage),
        }
        if self.state is TurnState.FAILED:
            # ACP has no stop reason for a failure (its prompt answer says end_turn, the error
            # in the turn's last message); on the wire a failed turn's is null, see "error".
            out["stopReason"] = None
        elif self.stop_reason:
            out["stopReason"] = self.stop_reason
        if self.error:
            out["error"] = self.error
        if self.cancelled_by:
            out["cancelledBy"] = self.cancelled_by
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
        usage_of(h),
        h.get("cancelledBy", ""),
    )
