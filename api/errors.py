"""The one table mapping each domain error to its HTTP status and JSON-RPC code, and the one
JSON error shape: ``{"error": {"code", "message", "data"}}``."""

from __future__ import annotations

from typing import Any

import redis
from kombu.exceptions import OperationalError

from orchestrator.agents.permissions import PermissionNotFound
from orchestrator.errors import (
    AncestorArchived,
    FleetError,
    IdempotencyKeyReused,
    InputRejected,
    InvalidIdempotencyKey,
    InvalidParams,
    LimitReached,
    SessionActive,
    SessionArchived,
    SessionNotFound,
    SessionUnarchived,
    StoreUnavailable,
    TurnNotFound,
    WriteUnconfirmed,
)
from orchestrator.storage.redisconn import store_unavailable

#: error class -> (HTTP status, JSON-RPC code). Looked up by walking the class's MRO, so a
#: subclass (``InvalidTitle``) maps like its parent unless listed itself.
ERROR_TABLE: dict[type[FleetError], tuple[int, int]] = {
    SessionNotFound: (404, -32002),
    TurnNotFound: (404, -32002),
    PermissionNotFound: (404, -32002),
    SessionActive: (409, -32003),
    SessionArchived: (409, -32004),
    AncestorArchived: (409, -32005),
    SessionUnarchived: (409, -32006),
    InvalidParams: (422, -32602),
    # JSON over a parse limit (depth, number, lone surrogate): malformed rather than invalid.
    InputRejected: (400, -32602),
    InvalidIdempotencyKey: (400, -32602),
    # The key was first sent with another request: the client's mistake, not a conflict of
    # state a retry could settle.
    IdempotencyKeyReused: (422, -32602),
    StoreUnavailable: (503, -32010),
    LimitReached: (429, -32011),
    # Applied on the primary, not acknowledged by enough replicas: retry (idempotent).
    WriteUnconfirmed: (503, -32012),
}


#: Foreign errors that may still reach an interface (a raw Redis call the store's translation
#: does not wrap; a publish to the broker, which is the same Redis) -> the domain error they
#: mean. The last line of defence: every store failure answers 503 / -32010, never a 500.
FOREIGN_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, OperationalError)
#: Every error ``translate`` accepts.
TRANSLATED: tuple[type[Exception], ...] = (FleetError, *FOREIGN_ERRORS)


def translate(exc: Exception) -> FleetError:
    """``exc`` as a ``FleetError``: itself, or ``StoreUnavailable`` for ``FOREIGN_ERRORS``.
    Raises ``TypeError`` for anything else."""
    if isinstance(exc, FleetError):
        return exc
    if isinstance(exc, FOREIGN_ERRORS):
        return store_unavailable(exc)
    raise TypeError(f"{type(exc).__name__} is not a store error")


def lookup(exc: FleetError) -> tuple[int, int]:
    """(HTTP status, JSON-RPC code) for ``exc``."""
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    raise KeyError(f"{type(exc).__name__} has no entry in ERROR_TABLE")


def error_body(code: str, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON error shape."""
    return {"error": {"code": code, "message": message, "data": data or {}}}


#: HTTP errors the framework raises itself (no route for the path, a method the path does
#: not take) -> (code, message); any other status keeps the framework's detail as message.
HTTP_ERRORS: dict[int, tuple[str, str]] = {
    404: ("not_found", "No such resource; see /docs for the API's paths."),
    405: ("method_not_allowed", "That method is not allowed on this path; see /docs."),
}


def http_error_body(status: int, detail: str) -> dict[str, Any]:
    """The JSON error shape for a framework HTTP error of ``status`` (``HTTP_ERRORS``)."""
    code, message = HTTP_ERRORS.get(status, ("http_error", detail))
    return error_body(code, message)


#: The most validation problems an error lists (REST ``data.errors``, ACP ``data.errors``): a
#: request of the allowed size can hold hundreds of thousands of wrong values, and listing
#: each would answer megabytes for a kilobyte's worth of advice. ``data.errorCount`` counts
#: them all.
MAX_LISTED_ERRORS = 20
#: How many of them the message names.
ERRORS_IN_MESSAGE = 5


def in_words(first: list[str], total: int, sep: str) -> str:
    """The first ``ERRORS_IN_MESSAGE`` of ``first`` (the problems' texts, in order) joined by
    ``sep``, then how many of the ``total`` problems it did not name: ``"a; b (and 7 more)"``."""
    said = sep.join(first[:ERRORS_IN_MESSAGE])
    rest = total - min(len(first), ERRORS_IN_MESSAGE)
    return said + (f" (and {rest} more)" if rest > 0 else "")
