"""The error tree of agent-fleet. Interfaces map each class once (``api/errors.py``).

::

    FleetError
    ├── SessionNotFound        unknown or deleted session
    ├── SessionActive          archive refused: live work, carries the items
    ├── SessionArchived        the operation needs an unarchived session
    ├── AncestorArchived       unarchive of a session whose ancestor is still archived
    ├── InvalidParams          a value the caller sent is not acceptable
    │   ├── InvalidTitle       a title that is empty after normalization
    │   └── TooManySessions    a bulk request selects more sessions than allowed
    ├── LimitReached           a FLEET_MAX_* limit refuses a new job, reminder or subagent
    └── StoreUnavailable       Redis cannot be reached or answered with an error

    TurnStopped                internal to the step runtime, never reaches an interface: a
                               step's write was refused because its turn stopped running
    StepSuperseded             internal to the step runtime: another copy of the step began
                               (orchestrator/fencing.py), so this copy writes nothing more
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.activity import ActivityItem


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


class SessionActive(FleetError):
    """Raised when archive is asked without ``stopActivity`` and the session has live work."""

    code = "session_active"

    def __init__(self, session_id: str, items: list[ActivityItem]) -> None:
        families = sorted({item.family for item in items})
        super().__init__(
            f"Session {session_id!r} has live work ({', '.join(families)}); "
            "archive with stopActivity to stop it, or wait until it is idle.",
            {"sessionId": session_id, "activity": [item.to_wire() for item in items]},
        )
        self.items = items


class SessionArchived(FleetError):
    """Raised when an operation that would run work targets an archived session."""

    code = "session_archived"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"Session {session_id!r} is archived; unarchive it first.", {"sessionId": session_id}
        )


class AncestorArchived(FleetError):
    """Raised when unarchiving a session whose ancestor is still archived."""

    code = "ancestor_archived"

    def __init__(self, session_id: str, ancestor_id: str) -> None:
        super().__init__(
            f"Session {session_id!r} is under archived session {ancestor_id!r}; "
            "unarchive that session instead.",
            {"sessionId": session_id, "archivedAncestor": ancestor_id},
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


class LimitReached(FleetError):
    """Raised when creating a job, a reminder or a subagent would go over one of the
    ``FLEET_MAX_*`` limits (nothing was written). ``limit`` is the setting's name,
    ``maximum`` its value, ``count`` the current count and ``detail`` what it counts
    (``16 live jobs in the session``). In a turn it becomes the tool call's ``failed``
    result (``orchestrator/limits.py``)."""

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
    """Raised when Redis cannot be reached or fails; nothing was half written."""

    code = "store_unavailable"

    def __init__(self, detail: str) -> None:
        super().__init__(f"The session store is unavailable: {detail}. Try again shortly.")


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
    (its lease lapsed while its worker was frozen; ``orchestrator/fencing.py``); nothing was
    written. Not a ``FleetError``: ``steps.run_step`` drops the copy (outcome ``superseded``)."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"this copy of turn {turn_id}'s step was superseded")
        self.turn_id = turn_id
