"""What a turn is: its states, the transitions every write follows, and its stored record.

``orchestrator/turn/turns.py`` (the lifecycle) and the step runtime act on them; the Lua scripts
take
the transition table through ``sources_of``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.models.usage import usage_of
from orchestrator.session.sessions import SESSION_ID_RE
from orchestrator.states import CANCELLED_BY_ARCHIVE as CANCELLED_BY_ARCHIVE
from orchestrator.states import CANCELLED_BY_DELETE as CANCELLED_BY_DELETE
from orchestrator.states import LIVE_STATES as LIVE_STATES
from orchestrator.states import STOP_REASON as STOP_REASON
from orchestrator.states import TRANSITIONS as TRANSITIONS
from orchestrator.states import TurnState as TurnState
from orchestrator.storage.store import Store, retried

# The turn's states, transitions and stop reasons are defined once, in ``orchestrator.states``
# (the Lua prelude is generated from them); they are re-exported here with the record.


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
