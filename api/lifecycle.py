"""Session lifecycle routes beside the basic ones of ``api/rest.py``: archive, delete, set a
title, close, cancel, and bulk archive (``POST /sessions/archive``). Errors come from
``api/errors.py`` through the app's handlers, in the one JSON shape.

Booleans are JSON booleans in bodies only (``StrictBool``: ``"false"``, ``0`` or ``"yes"``
answer 422, never coerced). No route takes a boolean in its query string, where ``true`` and
``"true"`` cannot be told apart; query parameters are strings or enums parsed strictly.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictStr

from api.context import dispatcher, store
from orchestrator import archive, audit, bulk, deletion, sessions, titles, turns
from orchestrator.errors import InvalidParams
from orchestrator.families import names as family_names

#: The most turns a cancel may name.
MAX_TURN_IDS = 1000


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


def _registered_family(name: str) -> str:
    if name not in family_names():
        raise ValueError(f"family must be one of {', '.join(family_names())}")
    return name


class ConfirmedItem(BaseModel):
    """One item the user confirmed stopping: a refusal's ``activity`` item, sent back as it
    came (its other fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    family: Annotated[StrictStr, AfterValidator(_registered_family)]
    id: Annotated[StrictStr, Field(max_length=200)]


class StopBody(_Strict):
    """Body of ``POST /sessions/{id}/archive`` and ``DELETE /sessions/{id}`` (optional)."""

    stopActivity: StrictBool = Field(
        default=False, description="Stop live work first; otherwise live work refuses (409)."
    )
    confirmedActivity: list[ConfirmedItem] | None = Field(
        default=None,
        description="With stopActivity: the items the user confirmed (the refusal's "
        "error.data.activity). If anything live now is not among them: 409 "
        "activity_changed with the current items, and nothing is written or stopped. "
        f"At most {archive.MAX_CONFIRMED} items.",
        json_schema_extra={"maxItems": archive.MAX_CONFIRMED},
    )

    def confirmed(self) -> archive.Confirmed | None:
        """The confirmation as (family, id) pairs, or None when not bound."""
        if self.confirmedActivity is None:
            return None
        return [(item.family, item.id) for item in self.confirmedActivity]


class CancelBody(_Strict):
    """Body of ``POST /sessions/{id}/cancel`` and ``/close`` (optional)."""

    turnIds: list[Annotated[StrictStr, Field(max_length=200)]] | None = Field(
        default=None,
        description="The turns to cancel (one of another session answers missing); "
        "without it, the turns live when the request arrives. A named turn that has ended "
        f"is left alone and answered with its end state. At most {MAX_TURN_IDS}.",
        json_schema_extra={"maxItems": MAX_TURN_IDS},
    )


def _cancel(session_id: str, body: CancelBody | None) -> dict[str, str]:
    st = store()
    sessions.get_session(st, session_id)
    named = body.turnIds if body is not None else None
    if named is None:
        return turns.cancel_session_turns(st, dispatcher(), session_id)
    if len(named) > MAX_TURN_IDS:
        raise InvalidParams(f"turnIds names more than {MAX_TURN_IDS} turns.", {"param": "turnIds"})
    return turns.cancel_session_turns(st, dispatcher(), session_id, named)


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

    @r.post("/sessions/{session_id}/archive", tags=["archive"])
    def archive_(session_id: str, body: StopBody | None = None) -> dict[str, Any]:
        """Archive. Live work and no ``stopActivity``: 409 ``session_active`` with every live
        item in ``error.data.activity``. With ``stopActivity``: archived first, stops sent;
        with ``confirmedActivity`` too, only if nothing live is missing from it (else 409
        ``activity_changed``, nothing written)."""
        body = body or StopBody()
        return archive.archive(
            store(),
            dispatcher(),
            session_id,
            stop_activity=body.stopActivity,
            confirmed=body.confirmed(),
        ).to_wire()

    @r.delete("/sessions/{session_id}", tags=["sessions"])
    def delete(session_id: str, body: StopBody | None = None) -> dict[str, Any]:
        """Delete a session (idempotent: ``deleted: false`` when there was nothing to
        delete). Live work in it or its subtree and no ``stopActivity``: 409
        ``session_active`` with the live items, nothing written. With ``stopActivity``: the
        subtree is archived and its work stopped as an archive would (``confirmedActivity``
        binds it the same way), then the session is deleted once its work has ended; work
        still live after the wait answers 409 ``session_active`` (the session stays
        archived, not deleted)."""
        body = body or StopBody()
        result = deletion.delete(
            store(),
            dispatcher(),
            session_id,
            stop_activity=body.stopActivity,
            confirmed=body.confirmed(),
        )
        return result.to_wire()

    @r.put("/sessions/{session_id}/title", tags=["sessions"])
    def set_title(session_id: str, body: TitleBody) -> dict[str, Any]:
        """Set the title (the normalizer of ACP session/set_title). 422 ``invalid_title``
        "Title must not be empty." when nothing is left after normalization."""
        stored = titles.set_title(store(), session_id, body.title)
        return {"sessionId": session_id, "title": stored}

    @r.post("/sessions/{session_id}/close", tags=["turns"])
    def close(session_id: str, body: CancelBody | None = None) -> dict[str, Any]:
        """Close the session as ACP session/close does: its live turns (or the ``turnIds``
        named) are cancelled (a queued prompt is discarded, a step in flight ends
        ``cancelling`` then ``cancelled``); ``turns`` answers each with its outcome. Jobs,
        reminders and subagents keep running; archive with ``stopActivity`` for those."""
        cancelled = _cancel(session_id, body)
        audit.record(store(), session_id, "close", "closed", cancelledTurns=len(cancelled))
        return {"sessionId": session_id, "closed": True, "turns": cancelled}

    @r.post("/sessions/{session_id}/cancel", tags=["turns"])
    def cancel(session_id: str, body: CancelBody | None = None) -> dict[str, Any]:
        """Cancel the turns named in ``turnIds``, or without it the turns live when the
        request arrives; ``turns`` maps each to ``cancelled``, ``cancelling`` (a step in
        flight settles it), its end state (it had ended: nothing was stopped) or
        ``missing`` (not a turn of this session)."""
        return {"sessionId": session_id, "turns": _cancel(session_id, body)}

    return r
