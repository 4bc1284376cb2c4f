"""Session lifecycle routes beside the basic ones of ``api/rest.py``: set a title, close,
cancel, and bulk archive (``POST /sessions/archive``). Errors come from ``api/errors.py``
through the app's handlers, in the one JSON shape.

Booleans are JSON booleans in bodies only (``StrictBool``: ``"false"``, ``0`` or ``"yes"``
answer 422, never coerced). No route takes a boolean in its query string, where ``true`` and
``"true"`` cannot be told apart; query parameters are strings or enums parsed strictly.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from api.context import dispatcher, store
from orchestrator import audit, bulk, sessions, titles, turns


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TitleBody(_Strict):
    """Body of ``PUT /sessions/{id}/title``."""

    title: StrictStr | None = Field(
        default=None,
        description="The new title; normalized like ACP session/set_title. Empty after "
        'normalization (or missing): 422 "Title must not be empty."',
    )


class BulkFilterBody(_Strict):
    """Which sessions (not archived) a bulk archive selects; at least one criterion."""

    cwd: StrictStr | None = Field(default=None, description="Exact absolute cwd.")
    idleSince: StrictStr | None = Field(
        default=None,
        description="ISO 8601 date-time with an offset or Z: last activity (updatedAt) older "
        "than this.",
        json_schema_extra={"format": "date-time"},
    )
    q: StrictStr | None = Field(
        default=None, description="Case-insensitive substring of the title."
    )


class BulkArchiveBody(_Strict):
    """Body of ``POST /sessions/archive``: exactly one of ``sessionIds`` and ``filter``."""

    sessionIds: list[StrictStr] | None = Field(
        default=None,
        description=f"Sessions to archive, in order (at most {bulk.MAX_IDS}).",
        json_schema_extra={"maxItems": bulk.MAX_IDS},
    )
    filter: BulkFilterBody | None = Field(
        default=None,
        description="Select sessions instead (at most FLEET_BULK_FILTER_MAX, default 50000).",
    )
    stopActivity: StrictBool = Field(
        default=False,
        description="Stop live work of the selected sessions; otherwise they are refused.",
    )
    dryRun: StrictBool = Field(default=False, description="Compute the outcomes and write nothing.")


def _cancel(session_id: str) -> dict[str, str]:
    st = store()
    sessions.get_session(st, session_id)
    return turns.cancel_session_turns(st, dispatcher(), session_id)


def router(auth: list[Any]) -> APIRouter:
    """The lifecycle routes, guarded by ``auth``."""
    r = APIRouter(dependencies=auth)

    @r.post("/sessions/archive", tags=["archive"])
    def bulk_archive(body: BulkArchiveBody) -> dict[str, Any]:
        """Archive many sessions: ``sessionIds`` (at most 10000) or a ``filter`` (cwd,
        idleSince, q; at most FLEET_BULK_FILTER_MAX sessions). Each session gets what
        ``POST /sessions/{id}/archive`` would give it: ``archived``, ``already_archived``,
        ``not_found``, ``refused`` (live work, no ``stopActivity``; with its live items in
        ``activity``), or ``skipped`` (a filtered session active again meanwhile). Written in
        batches; with ``stopActivity`` one stop request per family per batch is sent and not
        awaited. ``dryRun`` writes nothing. Too many sessions: 422 ``too_many_sessions``."""
        flt = None
        if body.filter is not None:
            flt = bulk.BulkFilter(body.filter.cwd, body.filter.idleSince, body.filter.q)
        result = bulk.bulk_archive(
            store(),
            dispatcher(),
            session_ids=body.sessionIds,
            flt=flt,
            stop_activity=body.stopActivity,
            dry_run=body.dryRun,
        )
        return result.to_wire()

    @r.put("/sessions/{session_id}/title", tags=["sessions"])
    def set_title(session_id: str, body: TitleBody) -> dict[str, Any]:
        """Set the title (the normalizer of ACP session/set_title). 422 ``invalid_title``
        "Title must not be empty." when nothing is left after normalization."""
        stored = titles.set_title(store(), session_id, body.title)
        return {"sessionId": session_id, "title": stored}

    @r.post("/sessions/{session_id}/close", tags=["turns"])
    def close(session_id: str) -> dict[str, Any]:
        """Close the session as ACP session/close does: its live turns are cancelled (a
        queued prompt is discarded, a step in flight ends ``cancelling`` then ``cancelled``).
        Jobs, reminders and subagents keep running; archive with ``stopActivity`` for those."""
        cancelled = _cancel(session_id)
        audit.record(store(), session_id, "close", "closed", cancelledTurns=len(cancelled))
        return {"sessionId": session_id, "closed": True, "turns": cancelled}

    @r.post("/sessions/{session_id}/cancel", tags=["turns"])
    def cancel(session_id: str) -> dict[str, Any]:
        """Cancel the session's live turns (ACP session/cancel); ``turns`` maps each turn id
        to ``cancelled``, ``cancelling`` (a step in flight settles it) or its end state."""
        return {"sessionId": session_id, "turns": _cancel(session_id)}

    return r
