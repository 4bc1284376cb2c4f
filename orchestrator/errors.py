"""The error tree of agent-fleet. Interfaces map each class once (``api/errors.py``).

::

    FleetError
    ├── SessionNotFound        unknown or deleted session
    ├── SessionActive          archive refused: live work, carries the items
    ├── SessionArchived        the operation needs an unarchived session
    ├── AncestorArchived       unarchive of a session whose ancestor is still archived
    ├── InvalidParams          a value the caller sent is not acceptable
    │   ├── InvalidTitle       a title that is empty after normalization
    │   ├── TooManySessions    a bulk request selects more sessions than allowed
    │   └── InputRejected      client JSON over a parse limit (nesting depth, number)
    └── StoreUnavailable       Redis cannot be reached or answered with an error
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


class StoreUnavailable(FleetError):
    """Raised when Redis cannot be reached or fails; nothing was half written."""

    code = "store_unavailable"

    def __init__(self, detail: str) -> None:
        super().__init__(f"The session store is unavailable: {detail}. Try again shortly.")
