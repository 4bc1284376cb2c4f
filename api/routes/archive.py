"""The archive: archive one session (stopping its work when asked), many at once (``POST
/sessions/archive``), and unarchive."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import AUTH, DispatcherDep, StoreDep, WiringDep
from api.routes.bodies import BulkArchiveBody, StopBody, UnarchiveBody
from orchestrator.archiving import archive, bulk

router = APIRouter(dependencies=AUTH, tags=["archive"])


@router.post("/sessions/archive")
def bulk_archive(
    body: BulkArchiveBody, store: StoreDep, dispatcher: DispatcherDep
) -> dict[str, Any]:
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
        store,
        dispatcher,
        session_ids=body.sessionIds,
        flt=flt,
        stop_activity=body.stopActivity,
        dry_run=body.dryRun,
    )
    return result.to_wire()


# The answer is built here (``JSONResponse``), not validated and serialized again against the
# declared ``dict[str, Any]`` (which only documents it): the hot route of an archive.
@router.post("/sessions/{session_id}/archive", response_model=dict[str, Any])
def archive_(
    session_id: str,
    fleet: WiringDep,
    body: StopBody | None = None,
) -> JSONResponse:
    """Archive. Live work and no ``stopActivity``: 409 ``session_active`` with every live
    item in ``error.data.activity``. With ``stopActivity``: archived first, stops sent;
    with ``confirmedActivity`` too, only if nothing live is missing from it (else 409
    ``activity_changed``, nothing written). The stops' ``stop`` audit entry and counts are
    written after the response (with other archives' within 20 ms)."""
    body = body or StopBody()
    result = archive.archive(
        fleet.store,
        fleet.dispatcher,
        session_id,
        stop_activity=body.stopActivity,
        confirmed=body.confirmed(),
        defer=fleet.background.submit,
    )
    return JSONResponse(result.to_wire())


@router.post("/sessions/{session_id}/unarchive")
def unarchive_(
    session_id: str, store: StoreDep, body: UnarchiveBody | None = None
) -> dict[str, Any]:
    """Unarchive (idempotent); restores nothing that was stopped. No body, or ``{}``: any
    member (``stopActivity`` included) or a body that is not an object answers 422."""
    restored = archive.unarchive(store, session_id)
    return archive.unarchive_to_wire(session_id, restored)
