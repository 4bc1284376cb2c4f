"""Permission requests waiting for a person: an agent asked before a tool call, under the
``ask`` policy. The waiting step records the request (``Keys.permissions``), a person's
client answers it (REST ``POST /sessions/{id}/permissions/{requestId}``, the CLI, an ACP
client) by pushing the chosen option to ``Keys.permission_answer``, and the step takes the
first answer. A request that meets no answer within its timeout, or whose turn stops (a
cancel, an archive), is answered ``cancelled``; the record goes when the request ends.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import FleetError, InvalidParams
from orchestrator.storage.store import Store, iso

#: Seconds one blocking read of an answer lasts before the stop and the deadline are looked at.
_WAIT_SLICE = 0.25
#: Seconds an answer is kept for its request after being pushed.
_ANSWER_TTL = 60
#: The words a person may answer besides an option id: the first option of that kind.
ALLOW, REJECT = "allow", "reject"


class PermissionNotFound(FleetError):
    """No permission request ``request_id`` waits in that session (answered, timed out,
    or never asked)."""

    code = "permission_not_found"

    def __init__(self, session_id: str, request_id: str) -> None:
        super().__init__(
            f"No permission request {request_id[:80]!r} is waiting in session "
            f"{session_id[:80]!r}; it was answered, it timed out, or its turn ended.",
            {"sessionId": session_id[:80], "requestId": request_id[:80]},
        )


@dataclass(frozen=True)
class Pending:
    """A permission request waiting for a person (its wire form is ``to_wire``)."""

    request_id: str
    turn_id: str
    tool_call: dict[str, Any]
    options: list[dict[str, Any]]
    asked_at: str
    expires_at: str

    def to_wire(self) -> dict[str, Any]:
        """``{requestId, turnId, toolCall, options, askedAt, expiresAt}``."""
        return {
            "requestId": self.request_id,
            "turnId": self.turn_id,
            "toolCall": self.tool_call,
            "options": self.options,
            "askedAt": self.asked_at,
            "expiresAt": self.expires_at,
        }


def pending(store: Store, session_id: str) -> list[Pending]:
    """The session's permission requests waiting for a person, oldest first."""
    raw: dict[str, str] = store.redis.hgetall(store.keys.permissions(session_id))
    found = [_read(text) for text in raw.values()]
    return sorted((p for p in found if p is not None), key=lambda p: p.asked_at)


def _read(text: str) -> Pending | None:
    try:
        d = json.loads(text)
        return Pending(
            d["requestId"], d["turnId"], d["toolCall"], d["options"], d["askedAt"], d["expiresAt"]
        )
    except (ValueError, KeyError, TypeError):
        return None


def record(store: Store, session_id: str, ask: Pending) -> None:
    """Record ``ask`` as waiting for a person (before anyone is told of it, so a client that
    hears of it finds it)."""
    store.redis.hset(store.keys.permissions(session_id), ask.request_id, json.dumps(ask.to_wire()))


def wait_for_answer(
    store: Store,
    session_id: str,
    ask: Pending,
    timeout: float,
    stopped: threading.Event,
) -> str | None:
    """Wait up to ``timeout`` s for a person's answer to ``ask`` (``record`` ed), or until
    ``stopped`` is set (the turn stopped). Returns the chosen option id, or ``None``
    (``cancelled``). The record is removed however it ends."""
    key = store.keys.permissions(session_id)
    answer_key = store.keys.permission_answer(ask.request_id)
    deadline = time.monotonic() + timeout
    try:
        while not stopped.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            got = store.redis.blpop([answer_key], timeout=min(_WAIT_SLICE, left))
            if got is not None:
                return None if got[1] == "cancelled" else str(got[1])
        return None
    finally:
        pipe = store.redis.pipeline(transaction=False)
        pipe.hdel(key, ask.request_id)
        pipe.delete(answer_key)
        pipe.execute()


def new_pending(
    request_id: str,
    turn_id: str,
    tool_call: dict[str, Any],
    options: list[dict[str, Any]],
    timeout: float,
) -> Pending:
    """A request asked now that expires in ``timeout`` s."""
    now = time.time()
    return Pending(
        request_id,
        turn_id,
        tool_call,
        options,
        iso(int(now * 1000)),
        iso(int((now + timeout) * 1000)),
    )


def answer(store: Store, session_id: str, request_id: str, outcome: str) -> str:
    """Answer a waiting request with ``outcome``: one of its options' ids, ``allow`` or
    ``reject`` (its first option of that kind), or ``cancelled``. Returns the option id sent
    (or ``cancelled``). Raises ``PermissionNotFound`` (nothing waits under that id),
    ``InvalidParams`` (an outcome that names none of its options)."""
    text = store.redis.hget(store.keys.permissions(session_id), request_id)
    found = _read(text) if isinstance(text, str) else None
    if found is None:
        raise PermissionNotFound(session_id, request_id)
    chosen = _choose(found, outcome)
    pipe = store.redis.pipeline(transaction=False)
    pipe.rpush(store.keys.permission_answer(request_id), chosen)
    pipe.expire(store.keys.permission_answer(request_id), _ANSWER_TTL)
    pipe.execute()
    return chosen


def _choose(found: Pending, outcome: str) -> str:
    ids = [str(o.get("optionId")) for o in found.options]
    if outcome == "cancelled" or outcome in ids:
        return outcome
    kinds = {ALLOW: ("allow_once", "allow_always"), REJECT: ("reject_once", "reject_always")}
    for kind in kinds.get(outcome, ()):
        for option in found.options:
            if option.get("kind") == kind:
                return str(option["optionId"])
    raise InvalidParams(
        f"outcome {outcome[:80]!r} names none of this request's options; answer 'allow', "
        f"'reject', 'cancelled' or one of {ids}.",
        {"param": "outcome", "allowed": ["allow", "reject", "cancelled", *ids]},
    )
