"""The one table mapping each domain error to its HTTP status and JSON-RPC code, and the one
JSON error shape: ``{"error": {"code", "message", "data"}}``."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import (
    AncestorArchived,
    FleetError,
    InputRejected,
    InvalidParams,
    SessionActive,
    SessionArchived,
    SessionNotFound,
    StoreUnavailable,
)

#: error class -> (HTTP status, JSON-RPC code). Looked up by walking the class's MRO, so a
#: subclass (``InvalidTitle``) maps like its parent unless listed itself.
ERROR_TABLE: dict[type[FleetError], tuple[int, int]] = {
    SessionNotFound: (404, -32002),
    SessionActive: (409, -32003),
    SessionArchived: (409, -32004),
    AncestorArchived: (409, -32005),
    InvalidParams: (422, -32602),
    # JSON over a parse limit (depth, number, lone surrogate): malformed rather than invalid.
    InputRejected: (400, -32602),
    StoreUnavailable: (503, -32010),
}


def lookup(exc: FleetError) -> tuple[int, int]:
    """(HTTP status, JSON-RPC code) for ``exc``."""
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    raise KeyError(f"{type(exc).__name__} has no entry in ERROR_TABLE")


def error_body(code: str, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON error shape."""
    return {"error": {"code": code, "message": message, "data": data or {}}}
