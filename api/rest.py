"""The HTTP API (FastAPI). ``create_app(settings)`` builds it: the routes by resource
(``api/routes/``), given the store, the dispatcher and the settings through dependencies
(``api/deps.py``); every error in the one shape of ``api/errors.py``; the guards of
``api/guards.py``; OpenAPI at ``/openapi.json`` and ``/docs`` (served offline, ``api/docs.py``);
the console at ``/console`` (``/`` redirects there)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import console, docs
from api.deps import Unauthorized, UnsupportedMediaType, Wiring, strict_request
from api.errors import (
    FOREIGN_ERRORS,
    MAX_LISTED_ERRORS,
    error_body,
    http_error_body,
    in_words,
    lookup,
    translate,
)
from api.guards import (
    MAX_BODY_BYTES,
    BodyGuard,
    HostGuard,
    OriginGuard,
    allowed_hosts,
    allowed_origins,
    origin_text,
)
from api.routes import ROUTERS
from api.routes.events import HEARTBEAT_SECONDS
from orchestrator.errors import FleetError
from orchestrator.families import Dispatcher
from orchestrator.logs import redact_every_handler
from orchestrator.process import containment
from orchestrator.settings import FleetSettings, get_settings
from orchestrator.storage import audit
from orchestrator.storage.store import Store


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
    ``HTTPValidationError``; an operation with a body also lists 413 (too large) and 415 (a
    body not sent as JSON)."""
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
                    # A route's own words for its 422 (IDEMPOTENT_RESPONSES) are kept after.
                    own = responses["422"].get("description", "Validation Error")
                    said = "" if own == "Validation Error" else f"; {own}"
                    responses["422"] = {"description": f"Invalid request{said}", **error}
                for status, answer in responses.items():
                    if status[:1] in "45":  # a route's declared errors have the one shape too
                        answer.setdefault("content", error["content"])
                if "requestBody" in op:  # strict_request and the body guard (api/guards.py)
                    responses["413"] = {"description": "Body larger than allowed", **error}
                    responses["415"] = {"description": "Body not sent as JSON", **error}
                responses.setdefault("default", {"description": "Error", **error})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


async def _fleet_error(_: Request, exc: Exception) -> JSONResponse:
    error = translate(exc)
    status, _code = lookup(error)
    return JSONResponse(error_body(error.code, error.message, error.data), status_code=status)


def _in_words(error: dict[str, Any]) -> str:
    """A validation error's message a person can act on: a body that is not JSON says where
    and why it stops being JSON, a missing body says one is needed; others as pydantic says."""
    loc, kind = tuple(error.get("loc", ())), error.get("type")
    if kind == "json_invalid":
        why = (error.get("ctx") or {}).get("error", "not JSON")
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"not valid JSON{at} ({why}); send a JSON object"
    if kind == "missing" and loc == ("body",):
        return "a JSON object is required (the body is empty)"
    return str(error.get("msg", ""))


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    found = exc.errors()
    errors = [
        {"loc": list(e.get("loc", ())), "msg": _in_words(e)} for e in found[:MAX_LISTED_ERRORS]
    ]
    texts = [".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in errors]
    where = in_words(texts, len(found), ", ")
    data = {"errors": errors, "errorCount": len(found)}
    return JSONResponse(
        error_body("invalid_params", f"Invalid request: {where}", data), status_code=422
    )


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(
        http_error_body(exc.status_code, str(exc.detail)),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def _unauthorized(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        error_body("unauthorized", "A valid bearer token is required."),
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _unsupported(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnsupportedMediaType)
    sent = exc.content_type
    said = f"Content-Type {sent[:100]!r}" if sent else "no Content-Type"
    message = (
        f"This route takes a JSON body and the request carries {said}: "
        "send the body as JSON with Content-Type: application/json."
    )
    data = {"contentType": sent[:100] if sent else None, "accepted": "application/json"}
    return JSONResponse(error_body("unsupported_media_type", message, data), status_code=415)


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FleetError, _fleet_error)
    for foreign in FOREIGN_ERRORS:  # a raw Redis or broker failure: 503, never a 500
        app.add_exception_handler(foreign, _fleet_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Unauthorized, _unauthorized)
    app.add_exception_handler(UnsupportedMediaType, _unsupported)


def _add_middleware(app: FastAPI, settings: FleetSettings, max_body_bytes: int) -> None:
    """The guards, outermost last: host (no token), origin, CORS (when origins are allowed),
    body (at most ``max_body_bytes``), actor."""
    app.add_middleware(_Actor)
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes)
    allowed = allowed_origins(settings.api_allowed_origins)
    if allowed:  # pages of an allowed origin may also read answers and send JSON
        app.add_middleware(
            CORSMiddleware,
            allow_origins=sorted(origin_text(o) for o in allowed),
            allow_methods=["*"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    # Without a token the Host must name this API; with one, any name may (None).
    hosts = (
        None if settings.api_token else allowed_hosts(settings.api_allowed_hosts, settings.api_host)
    )
    app.add_middleware(OriginGuard, allowed=allowed, hosts=hosts)
    app.add_middleware(HostGuard, hosts=hosts)  # outermost: refused before anything


def create_app(
    settings: FleetSettings | None = None,
    *,
    store: Store | None = None,
    dispatcher: Dispatcher | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    sse_heartbeat_seconds: float = HEARTBEAT_SECONDS,
) -> FastAPI:
    """Build the API application for ``settings`` (default: the process's, read from
    ``FLEET_*``), on ``store`` and ``dispatcher`` when given, else on ones made from the
    settings and closed at the application's shutdown. A request body over ``max_body_bytes``
    answers 413; an idle ``GET /events`` stream gets a heartbeat every
    ``sse_heartbeat_seconds``. Raises ``SystemExit`` with a hint when one must be made and
    ``FLEET_REDIS_URL`` is missing or invalid.

    Every log handler of the process gets ``RedactSecrets`` (``orchestrator.logs``), so no
    token reaches a log line, the access log included, however the server was started
    (``fleet api``, or ``uvicorn api.rest:create_app --factory`` with uvicorn's own logging)."""
    redact_every_handler()
    settings = settings if settings is not None else get_settings()
    containment.choose(settings.containment)  # the mode /ready reports
    wiring = Wiring.build(settings, store, dispatcher)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        wiring.close()

    app = FastAPI(
        title="agent-fleet",
        version="0.1.0",
        description="Sessions, activity and archive for agent fleets.",
        dependencies=[Depends(strict_request)],
        docs_url=None,
        lifespan=lifespan,
    )
    app.state.fleet = wiring
    app.state.sse_heartbeat_seconds = sse_heartbeat_seconds
    _add_error_handlers(app)
    _document_errors(app)
    _add_middleware(app, settings, max_body_bytes)
    for router in ROUTERS:
        app.include_router(router)
    docs.mount(app)
    console.mount(app)
    return app
