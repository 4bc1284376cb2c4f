"""Sessions: create, list (filters, title search, cursors), read, retitle, delete, and read
a session's live activity and conversation."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import AUTH, DispatcherDep, StoreDep
from api.routes.bodies import (
    IDEMPOTENT_RESPONSES,
    QUERY_INT,
    CreateSession,
    IdempotencyKeyDep,
    StopBody,
    TitleBody,
)
from orchestrator.agents.definitions import agent_for
from orchestrator.archiving import deletion
from orchestrator.census import activity
from orchestrator.session import sessions, titles

router = APIRouter(dependencies=AUTH)
_TAGS: list[str | Any] = ["sessions"]


@router.post("/sessions", status_code=201, tags=_TAGS, responses=IDEMPOTENT_RESPONSES)
def create(
    body: CreateSession,
    store: StoreDep,
    idempotency_key: IdempotencyKeyDep,
) -> dict[str, Any]:
    """Create a session (a subagent session with ``parentId``). With ``Idempotency-Key``, a
    retry answers 201 with the session the first request created, and creates none."""
    created = sessions.create_session(
        store,
        body.cwd,
        body.parentId,
        model=body.model,
        idempotency_key=idempotency_key,
        agent=agent_for(store.settings, body.agent),
    )
    return created.to_info()


@router.get("/sessions", tags=_TAGS)
def list_(
    store: StoreDep,
    archived: Annotated[str | None, Query(description="exclude | include | only")] = None,
    cwd: Annotated[str | None, Query(description="Exact absolute cwd.")] = None,
    cursor: Annotated[str | None, Query(description="nextCursor of the previous page.")] = None,
    limit: Annotated[int, QUERY_INT, Query(ge=1, le=sessions.MAX_PAGE)] = sessions.DEFAULT_PAGE,
    q: Annotated[
        str | None,
        Query(description="Title search: case-insensitive substring of the title."),
    ] = None,
) -> dict[str, Any]:
    """List sessions newest activity first; filters apply before pagination, with
    cursors as in ACP session/list. ``q`` is answered by a bounded server-side scan of the
    listing index (at most 5,000 sessions read per request, titles in batches of 500):
    a page of a search may hold fewer than ``limit`` sessions, even none, and still carry
    ``nextCursor``; follow it until it is absent to see every match once."""
    page = sessions.list_sessions(
        store, archived=archived, cwd=cwd, cursor=cursor, limit=limit, q=q
    )
    out: dict[str, Any] = {"sessions": [s.to_info() for s in page.sessions]}
    if page.next_cursor:
        out["nextCursor"] = page.next_cursor
    return out


@router.get("/sessions/{session_id}", tags=_TAGS)
def get(session_id: str, store: StoreDep) -> dict[str, Any]:
    """One session."""
    return sessions.get_session(store, session_id).to_info()


@router.delete("/sessions/{session_id}", tags=_TAGS)
def delete(
    session_id: str, store: StoreDep, dispatcher: DispatcherDep, body: StopBody | None = None
) -> dict[str, Any]:
    """Delete a session (idempotent: ``deleted: false`` when there was nothing to
    delete). Live work in it or its subtree and no ``stopActivity``: 409
    ``session_active`` with the live items, nothing written. With ``stopActivity``: the
    subtree is archived and its work stopped as an archive would (``confirmedActivity``
    binds it the same way), then the session is deleted once its work has ended; work
    still live after the wait answers 409 ``session_active`` (the session stays
    archived, not deleted)."""
    body = body or StopBody()
    result = deletion.delete(
        store,
        dispatcher,
        session_id,
        stop_activity=body.stopActivity,
        confirmed=body.confirmed(),
    )
    return result.to_wire()


@router.put("/sessions/{session_id}/title", tags=_TAGS)
def set_title(session_id: str, body: TitleBody, store: StoreDep) -> dict[str, Any]:
    """Set the title (the normalizer of ACP session/set_title). 422 ``invalid_title``
    "Title must not be empty." when nothing is left after normalization."""
    stored = titles.set_title(store, session_id, body.title)
    return {"sessionId": session_id, "title": stored}


@router.get("/sessions/{session_id}/activity", tags=["activity"])
def get_activity(session_id: str, store: StoreDep, dispatcher: DispatcherDep) -> dict[str, Any]:
    """Live work of the session, per item: family, id, label."""
    items = activity.census(store, session_id, dispatcher)
    return {"sessionId": session_id, "activity": [i.to_wire() for i in items]}


@router.get("/sessions/{session_id}/conversation", tags=_TAGS)
def get_conversation(
    session_id: str,
    store: StoreDep,
    limit: Annotated[int, QUERY_INT, Query(ge=1, le=sessions.MAX_CONVERSATION)] = 200,
) -> dict[str, Any]:
    """The last ``limit`` updates of the conversation (ACP ``session/update`` payloads,
    oldest first); archived sessions keep theirs."""
    updates = sessions.conversation(store, session_id, limit)
    return {"sessionId": session_id, "updates": updates}
