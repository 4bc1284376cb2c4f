"""The error tree of agent-fleet. Interfaces map each class once (``api/errors.py``).

::

    FleetError
    ├── SessionNotFound        unknown or deleted session
    ├── TurnNotFound           unknown or malformed turn id
    ├── SessionActive          archive or delete refused: live work, carries the items
    │   └── ActivityChanged    a stop confirmed a list and something else is live now
    ├── SessionArchived        the operation needs an unarchived session
    ├── AncestorArchived       unarchive of a session whose ancestor is still archived
    ├── SessionUnarchived      a delete's session was unarchived while it waited to delete
    ├── InvalidParams          a value the caller sent is not acceptable
    │   ├── InvalidTitle       a title that is empty after normalization
    │   ├── TooManySessions    a bulk request selects more sessions than allowed
    │   ├── InputRejected      client JSON over a parse limit (nesting depth, number)
    │   ├── DuplicateKey       client JSON with a key given twice in one object
    │   ├── InvalidIdempotencyKey   an idempotency key too long, empty or not printable
    │   └── IdempotencyKeyReused    an idempotency key sent again with another request
    ├── HostHeld               a job worker's host name is held by another live worker
    ├── LimitReached           a FLEET_MAX_* limit refuses a new job, reminder or subagent
    └── StoreUnavailable       Redis cannot be reached or answered with an error
        ├── WriteUnconfirmed   a lifecycle write fewer replicas acknowledged than required
        └── WriteOutcomeUnknown     a create or prompt whose reply was lost: it may have run

    TurnStopped                internal to the step runtime, never reaches an interface: a
                               step's write was refused because its turn stopped running
    StepSuperseded             internal to the step runtime: another copy of the step began
                               (orchestrator/session/fencing.py), so this copy writes nothing more
"""

from __future__ import annotations

from typing import Any

from orchestrator.items import ActivityItem

#: How much of an id an answer quotes back (errors, bulk results): a malformed id names
#: nothing and may be as long as a request body.
QUOTED_ID_CHARS = 80


def quoted_id(some_id: str) -> str:
    """``some_id`` (a session or turn id) as an answer echoes it: its first
    ``QUOTED_ID_CHARS`` characters, so a well-formed id (at most 64) whole, which is how
    clients match answers to requests."""
    return some_id[:QUOTED_ID_CHARS]


class FleetError(Exception):
    """Base of every error agent-fleet raises on purpose; ``code`` is a stable string."""

    code = "fleet_error"

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data or {}


class SessionNotFound(FleetError):
    """Raised when a session id is unknown, malformed or names a deleted session."""

    code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id!r} was not found.", {"sessionId": session_id})


class TurnNotFound(FleetError):
    """Raised when a turn id is unknown or malformed."""

    code = "turn_not_found"

    def __init__(self, turn_id: str) -> None:
        shown = quoted_id(turn_id)
        super().__init__(f"Turn {shown!r} was not found.", {"turnId": shown})


class SessionActive(FleetError):
    """Raised when archive or delete (``action``) is asked without ``stopActivity`` and the
    session or its subtree has live work."""

    code = "session_active"

    def __init__(self, session_id: str, items: list[ActivityItem], action: str = "archive") -> None:
        families = sorted({item.family for item in items})
        super().__init__(
            f"Session {session_id!r} has live work ({', '.join(families)}); "
            f"{action} with stopActivity to stop it, or wait until it is idle.",
            {"sessionId": session_id, "activity": [item.to_wire() for item in items]},
        )
        self.items = items


class ActivityChanged(SessionActive):
    """Raised when an archive (or delete) with ``stopActivity`` carries the items the user
    confirmed and something live now is not among them; nothing was written. Carries every
    live item, like its parent."""

    code = "activity_changed"

    def __init__(self, session_id: str, items: list[ActivityItem], action: str = "archive") -> None:
        super().__init__(session_id, items, action)
        self.message = (
            f"The live work of session {session_id!r} changed since it was confirmed; "
            "nothing was stopped. Confirm the current list to stop it."
        )
        self.args = (self.message,)


class SessionArchived(FleetError):
    """Raised when an operation that would run work targets an archived session, or one
    under an archived ancestor (``archived_by``: the session to unarchive, named in the
    message and as ``data.archivedAncestor``, since unarchiving the session itself would be
    refused with ``AncestorArchived``)."""

    code = "session_archived"

    def __init__(self, session_id: str, archived_by: str | None = None) -> None:
        if archived_by is None or archived_by == session_id:
            super().__init__(
                f"Session {session_id!r} is archived; unarchive it first.",
                {"sessionId": session_id},
            )
            return
        super().__init__(
            f"Session {session_id!r} is under archived session {archived_by!r}; unarchive "
            "that session first.",
            {"sessionId": session_id, "archivedAncestor": archived_by},
        )


class AncestorArchived(FleetError):
    """Raised when unarchiving a session whose ancestor is still archived; ``ancestor_id``
    is the farthest archived ancestor, the one whose unarchive is not refused so."""

    code = "ancestor_archived"

    def __init__(self, session_id: str, ancestor_id: str) -> None:
        super().__init__(
            f"Session {session_id!r} is under archived session {ancestor_id!r}; "
            "unarchive that session instead.",
            {"sessionId": session_id, "archivedAncestor": ancestor_id},
        )


class SessionUnarchived(FleetError):
    """Raised when a delete with ``stopActivity`` finds, after waiting for the work it stopped
    to end, that its session is no longer archived by the archive it made (it was unarchived,
    and maybe archived again): whatever was created since is the user's, so nothing is
    deleted."""

    code = "session_unarchived"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"Session {session_id!r} was unarchived while the delete waited for its work to "
            "stop; nothing was deleted. Delete it again if it should still go.",
            {"sessionId": session_id},
        )


class InvalidParams(FleetError):
    """Raised when a parameter is missing, ill-typed or out of range."""

    code = "invalid_params"


class InvalidTitle(InvalidParams):
    """Raised when a title is empty after normalization."""

    code = "invalid_title"


class TooManySessions(InvalidParams):
    """Raised when a bulk request names or selects more sessions than it may (nothing is
    written); ``data`` carries ``param``, ``max`` and, for filters, the setting to raise."""

    code = "too_many_sessions"


class InputRejected(InvalidParams):
    """Raised by ``orchestrator.untrusted.loads`` for a client's JSON over one of its limits.
    ``data``: ``limit`` (``depth`` | ``number``), ``max``,
    ``path`` (where, as ``$.params.title[0]``) and ``param`` (``body``, ``cursor``,
    ``message``). ``partial`` is the parsed document when the parser got that far, so a
    JSON-RPC transport can still answer the request's id; ``None`` otherwise."""

    code = "input_rejected"

    def __init__(self, message: str, data: dict[str, Any], partial: Any = None) -> None:
        super().__init__(message, data)
        self.partial = partial


class DuplicateKey(InvalidParams):
    """Raised by ``orchestrator.untrusted.loads`` for a client's JSON object that gives one
    key more than once (RFC 8259 leaves its meaning open; taking the last would act on a value
    the sender may not have meant). ``data``: ``param`` (the key), ``path`` (the member's
    place, as ``$.filter.cwd``) and ``in`` (``body``, ``cursor``, ``message``). ``partial`` is
    the parsed document, so a JSON-RPC transport can still answer the request's id."""

    def __init__(self, message: str, data: dict[str, Any], partial: Any = None) -> None:
        super().__init__(message, data)
        self.partial = partial


class InvalidIdempotencyKey(InvalidParams):
    """Raised when an idempotency key (REST ``Idempotency-Key``, ACP
    ``_meta.agentFleet.idempotencyKey``) is empty, longer than its cap or holds a character
    that is not printable ASCII; ``data``: ``param`` (``idempotencyKey``), ``max``."""

    code = "invalid_idempotency_key"


class IdempotencyKeyReused(InvalidParams):
    """Raised when an idempotency key comes with a request other than the one it was first
    sent with (another cwd, parent or model; another prompt text), within its TTL: nothing
    was written. ``data``: ``param`` (``idempotencyKey``)."""

    code = "idempotency_key_reused"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"This idempotency key was already used for another {what} request; a retry must "
            "send the same request, and a new request a new key.",
            {"param": "idempotencyKey"},
        )


class HostHeld(FleetError):
    """Raised when a job worker starts with a host name another live job worker holds (stops
    are routed by host name, so two would take each other's stops); ``data`` names the
    holder: ``host``, ``instance``, ``pid``, ``since`` (ISO 8601)."""

    code = "host_held"

    def __init__(self, host: str, instance: str, pid: str, since: str) -> None:
        super().__init__(
            f"Host name {host!r} is held by the live job worker {instance} (pid {pid}, "
            f"since {since}); give this worker another --host, or stop that one first.",
            {"host": host, "instance": instance, "pid": pid, "since": since},
        )


class LimitReached(FleetError):
    """Raised when creating a job, a reminder or a subagent would go over one of the
    ``FLEET_MAX_*`` limits (nothing was written). ``limit`` is the setting's name,
    ``maximum`` its value, ``count`` the current count and ``detail`` what it counts
    (``16 live jobs in the session``). In a turn it becomes the tool call's ``failed``
    result (``orchestrator/session/limits.py``)."""

    code = "limit_reached"

    def __init__(self, limit: str, maximum: int, count: int, detail: str) -> None:
        super().__init__(
            f"limit {limit}={maximum} reached ({detail})",
            {"limit": limit, "max": maximum, "count": count},
        )
        self.limit = limit
        self.maximum = maximum
        self.count = count


class StoreUnavailable(FleetError):
    """Raised when Redis cannot be reached or fails; nothing was half written (except for
    ``WriteUnconfirmed``, whose write is on the primary)."""

    code = "store_unavailable"

    def __init__(self, detail: str, *, transient: bool = True) -> None:
        detail = detail.rstrip(". ")
        #: Whether trying again may succeed (``False``: the URL or credentials are wrong).
        self.transient = transient
        advice = (
            "Try again shortly."
            if transient
            else "This is a configuration error: check FLEET_REDIS_URL and its credentials."
        )
        super().__init__(f"The session store is unavailable: {detail}. {advice}")


class WriteUnconfirmed(StoreUnavailable):
    """Raised when a lifecycle write (archive, unarchive, delete, a bulk batch, a client
    title) was applied on the Redis primary but fewer than ``FLEET_REDIS_MIN_REPLICAS_ACK``
    replicas acknowledged it within ``store.REPLICA_ACK_TIMEOUT_MS``: it may or may not
    survive a failover. Retrying is safe (archive, unarchive and delete are idempotent; a
    retried archive answers only once replicas hold it). ``data``: ``{"replicasAcked",
    "replicasRequired"}``."""

    code = "write_unconfirmed"

    def __init__(self, acked: int, required: int) -> None:
        self.transient = True
        FleetError.__init__(
            self,
            f"The write was applied on the Redis primary but only {acked} of the {required} "
            "required replicas acknowledged it, so it may or may not survive a failover. "
            "Retrying is safe: the operation is idempotent.",
            {"replicasAcked": acked, "replicasRequired": required},
        )


class WriteOutcomeUnknown(StoreUnavailable):
    """Raised when the connection to Redis was lost after a session's creation or a prompt
    was sent and before its reply came: the write may or may not have been applied (its
    script is atomic: all of it or nothing). ``data``: ``outcome`` (``unknown``),
    ``idempotencyKey`` (whether the request carried one: retrying with it is then safe) and
    ``check`` (how to find out otherwise)."""

    code = "write_outcome_unknown"

    def __init__(self, what: str, check: str, *, keyed: bool) -> None:
        advice = (
            "Retry with the same idempotency key: it answers what was done and runs nothing twice."
            if keyed
            else f"Check before retrying ({check}), or send an idempotency key with the retry "
            "and with later requests."
        )
        self.transient = True
        FleetError.__init__(
            self,
            f"The connection to the session store was lost after the {what} was sent, so it "
            f"may have been applied. {advice}",
            {"outcome": "unknown", "idempotencyKey": keyed, "check": check},
        )


class TurnStopped(Exception):
    """Raised inside a turn's step when a write it asked for (a job, a reminder, a subagent) was
    refused because the turn no longer runs (stopped or archived); nothing was written. Not a
    ``FleetError``: the step runtime handles it and it never reaches an interface."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn {turn_id} no longer runs")
        self.turn_id = turn_id


class StepSuperseded(Exception):
    """Raised inside a step when a write it asked for (a conversation update, the turn's
    advance or end) was refused because another copy of the same step began since this one
    (its lease lapsed while its worker was frozen; ``orchestrator/session/fencing.py``); nothing was
    written. Not a ``FleetError``: ``steps.run_step`` drops the copy (outcome ``superseded``)."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"this copy of turn {turn_id}'s step was superseded")
        self.turn_id = turn_id
