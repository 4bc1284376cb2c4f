"""The HTTP API (FastAPI). Every route decodes, calls the orchestrator, encodes; errors come
from ``api/errors.py`` in one shape. OpenAPI at ``/docs`` and ``/openapi.json``."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection

from api import console, lifecycle, ops, sse
from api.acp import AcpConnection, encode_message, shared_hub
from api.context import dispatcher, redis_url, store
from api.errors import FOREIGN_ERRORS, error_body, lookup, translate
from api.guards import BodyGuard, OriginGuard, allowed_origins, origin_text
from orchestrator import activity, archive, audit, sessions, turns
from orchestrator.errors import FleetError, InvalidParams
from orchestrator.logs import redact_every_handler
from orchestrator.settings import get_settings

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_Strict):
    """Body of ``POST /sessions``."""

    cwd: StrictStr = Field(description="Absolute working directory.")
    parentId: StrictStr | None = Field(default=None, description="Parent session (subagent).")
    model: StrictStr | None = Field(
        default=None, description="Model name for FLEET_MODEL's backend (default: its own)."
    )


class PromptBody(_Strict):
    """Body of ``POST /sessions/{id}/prompt``."""

    prompt: StrictStr = Field(max_length=turns.MAX_PROMPT, description="The prompt text.")


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` with the Bearer scheme (the
    scheme is case-insensitive, RFC 7235); compared in constant time."""
    scheme, _, supplied = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(supplied.strip().encode(), token.encode())


def _authorize(
    request: HTTPConnection, authorization: Annotated[str | None, Header()] = None
) -> None:
    token = get_settings().api_token
    if not token or bearer_ok(authorization, token):
        return
    # EventSource cannot send headers: GET /events alone also takes ``?token=`` (constant time).
    if request.url.path == "/events" and request.scope.get("method") == "GET":
        supplied = request.query_params.get("token")
        if supplied is not None and hmac.compare_digest(supplied.encode(), token.encode()):
            return
    raise _Unauthorized()


class _Unauthorized(Exception):
    pass


class _Actor:
    """ASGI middleware: changes made while serving a request are audited as made by
    ``rest:<client host>`` (ACP over WebSocket: ``acp:ws:<client host>``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        host = client[0] if client else "unknown"
        kind = "rest" if scope["type"] == "http" else "acp:ws"
        with audit.acting_as(f"{kind}:{host}"):
            await self.app(scope, receive, send)


#: The one error shape (``api/errors.py``), as documented in the OpenAPI document.
ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "data"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string", "minLength": 1},
                "data": {"type": "object"},
            },
        }
    },
}


def _document_errors(app: FastAPI) -> None:
    """Make the OpenAPI document tell the truth about errors: every operation's 422 and
    its other error answers (``default``) have the one error shape, not FastAPI's
    ``HTTPValidationError``."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas["Error"] = ERROR_SCHEMA
        error = {
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        }
        for item in doc.get("paths", {}).values():
            for op in item.values():
                responses = op.setdefault("responses", {})
                if "422" in responses:
                    responses["422"] = {"description": "Invalid request", **error}
                responses.setdefault("default", {"description": "Error", **error})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _single_valued_query(request: HTTPConnection) -> None:
    """Refuse a query parameter given twice (``?archived=only&archived=include``): taking one
    of them silently would answer a question the caller did not ask. (``HTTPConnection``, not
    ``Request``: as an app-wide dependency it also runs for the ``/acp`` WebSocket.)"""
    for name in request.query_params:
        if len(request.query_params.getlist(name)) > 1:
            raise InvalidParams(
                f"query parameter {name!r} was given more than once.", {"param": name}
            )


def create_app() -> FastAPI:
    """Build the API application. Every log handler of the process gets ``RedactSecrets``
    (``orchestrator.logs``), so no token reaches a log line, the access log included, however
    the server was started (``fleet api``, or ``uvicorn api.rest:create_app --factory`` with
    uvicorn's own logging)."""
    redact_every_handler()
    app = FastAPI(
        title="agent-fleet",
        version="0.1.0",
        description="Sessions, activity and archive for agent fleets.",
        dependencies=[Depends(_single_valued_query)],
    )

    @app.exception_handler(FleetError)
    async def _fleet_error(_: Request, exc: Exception) -> JSONResponse:
        error = translate(exc)
        status, _code = lookup(error)
        return JSONResponse(error_body(error.code, error.message, error.data), status_code=status)

    for foreign in FOREIGN_ERRORS:  # a raw Redis or broker failure: 503, never a 500
        app.add_exception_handler(foreign, _fleet_error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        where = ", ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in errors)
        return JSONResponse(
            error_body("invalid_params", f"Invalid request: {where}", {"errors": errors}),
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = {
            404: "No such resource; see /docs for the API's paths.",
            405: "That method is not allowed on this path; see /docs.",
        }.get(exc.status_code, str(exc.detail))
        return JSONResponse(
            error_body(code, message),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(_: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse(
            error_body("unauthorized", "A valid bearer token is required."),
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.get("/health", tags=["ops"])
    def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    _document_errors(app)
    auth = [Depends(_authorize)]
    app.add_middleware(_Actor)
    app.add_middleware(BodyGuard)
    origins = sorted(origin_text(o) for o in allowed_origins())
    if origins:  # pages of an allowed origin may also read answers and send JSON
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["*"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    app.add_middleware(OriginGuard)  # outermost: refused before anything else runs
    app.include_router(ops.router(auth))
    # Before the /sessions/{session_id}/... routes below: POST /sessions/archive is bulk.
    app.include_router(lifecycle.router(auth))
    app.include_router(sse.router(auth))
    console.mount(app)

    @app.post("/sessions", status_code=201, dependencies=auth, tags=["sessions"])
    def create(body: CreateSession) -> dict[str, Any]:
        """Create a session (a subagent session with ``parentId``)."""
        return sessions.create_session(store(), body.cwd, body.parentId, model=body.model).to_info()

    @app.get("/sessions", dependencies=auth, tags=["sessions"])
    def list_(
        archived: Annotated[str | None, Query(description="exclude | include | only")] = None,
        cwd: Annotated[str | None, Query(description="Exact absolute cwd.")] = None,
        cursor: Annotated[str | None, Query(description="nextCursor of the previous page.")] = None,
        limit: Annotated[int, Query(ge=1, le=sessions.MAX_PAGE)] = sessions.DEFAULT_PAGE,
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
            store(), archived=archived, cwd=cwd, cursor=cursor, limit=limit, q=q
        )
        out: dict[str, Any] = {"sessions": [s.to_info() for s in page.sessions]}
        if page.next_cursor:
            out["nextCursor"] = page.next_cursor
        return out

    @app.get("/sessions/{session_id}", dependencies=auth, tags=["sessions"])
    def get(session_id: str) -> dict[str, Any]:
        """One session."""
        return sessions.get_session(store(), session_id).to_info()

    @app.get("/sessions/{session_id}/activity", dependencies=auth, tags=["activity"])
    def get_activity(session_id: str) -> dict[str, Any]:
        """Live work of the session, per item: family, id, label."""
        items = activity.census(store(), session_id, dispatcher())
        return {"sessionId": session_id, "activity": [i.to_wire() for i in items]}

    @app.get("/sessions/{session_id}/conversation", dependencies=auth, tags=["sessions"])
    def get_conversation(
        session_id: str,
        limit: Annotated[int, Query(ge=1, le=sessions.MAX_CONVERSATION)] = 200,
    ) -> dict[str, Any]:
        """The last ``limit`` updates of the conversation (ACP ``session/update`` payloads,
        oldest first); archived sessions keep theirs."""
        updates = sessions.conversation(store(), session_id, limit)
        return {"sessionId": session_id, "updates": updates}

    @app.post("/sessions/{session_id}/prompt", status_code=202, dependencies=auth, tags=["turns"])
    def prompt(session_id: str, body: PromptBody) -> dict[str, Any]:
        """Start a turn (it queues behind a running one). 409 if the session is archived."""
        tid = turns.start_turn(store(), dispatcher(), session_id, body.prompt)
        return {"sessionId": session_id, "turnId": tid}

    @app.get("/turns/{turn_id}", dependencies=auth, tags=["turns"])
    def get_turn(turn_id: str) -> dict[str, Any]:
        """A turn's state."""
        turn = (
            turns.get_turn(store(), turn_id) if sessions.SESSION_ID_RE.fullmatch(turn_id) else None
        )
        if turn is None:
            return JSONResponse(
                error_body("turn_not_found", f"Turn {turn_id[:80]!r} was not found."),
                status_code=404,
            )  # type: ignore[return-value]
        return turn.to_wire()

    @app.post("/sessions/{session_id}/unarchive", dependencies=auth, tags=["archive"])
    def unarchive_(session_id: str) -> dict[str, Any]:
        """Unarchive (idempotent); restores nothing that was stopped."""
        restored = archive.unarchive(store(), session_id)
        return {"sessionId": session_id, "archived": False, "restored": restored}

    @app.websocket("/acp")
    async def acp_socket(ws: WebSocket) -> None:
        """ACP over WebSocket: one JSON-RPC message per text frame (a binary frame is read as
        UTF-8 text). Malformed messages are answered with errors; the socket stays open."""
        token = get_settings().api_token
        if token:
            header = ws.headers.get("authorization") or f"Bearer {ws.query_params.get('token', '')}"
            if not bearer_ok(header, token):
                await ws.close(code=4401, reason="A valid bearer token is required.")
                return
        await ws.accept()
        st = store()

        async def send(message: dict[str, Any]) -> None:
            await ws.send_text(encode_message(message))

        conn = AcpConnection(send, st, dispatcher(), shared_hub(redis_url(), st.keys.events))
        try:
            while True:
                frame = await ws.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                text = frame.get("text")
                if text is None:
                    data = frame.get("bytes") or b""
                    text = data.decode("utf-8", errors="replace")
                await conn.handle_text(text)
        except WebSocketDisconnect:
            pass
        finally:
            await conn.close()

    return app
