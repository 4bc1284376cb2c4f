"""What every route of the HTTP API is given, through FastAPI dependencies: the settings, the
store and the dispatcher of the application that serves it (``create_app``), never process
globals, so one process may serve several apps on different stores (as the tests do).

``Wiring`` is kept on ``app.state.fleet``; ``StoreDep``, ``DispatcherDep`` and ``SettingsDep``
are the annotations a route takes them by. ``authorize`` is the bearer-token check every
route but ``/health``, ``/ready``, ``/docs`` and the console's page runs first.

Every dependency here is ``async def`` and never blocks: FastAPI runs a plain ``def``
dependency in its thread pool, one thread hop per dependency per request.
"""

from __future__ import annotations

import difflib
import hmac
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import Depends, Header
from starlette.requests import HTTPConnection, Request

from api.context import checked_redis_url
from api.guards import is_json_type
from api.wiring import celery_dispatcher
from orchestrator import untrusted
from orchestrator.errors import InvalidParams
from orchestrator.families import Dispatcher
from orchestrator.settings import FleetSettings
from orchestrator.storage.bookkeeping import Bookkeeper
from orchestrator.storage.store import Store


@dataclass
class Wiring:
    """One application's settings, store and dispatcher. ``owned`` lists what ``build``
    made itself and ``close`` releases (never what the caller passed in)."""

    settings: FleetSettings
    store: Store
    dispatcher: Dispatcher
    owned: list[Any] = field(default_factory=list)
    #: Writes best-effort bookkeeping after a response (``archive.archive``'s ``defer``),
    #: coalesced on one thread; drained at shutdown.
    background: Bookkeeper = field(init=False)

    def __post_init__(self) -> None:
        self.background = Bookkeeper(self.store)

    @classmethod
    def build(
        cls,
        settings: FleetSettings,
        store: Store | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> Wiring:
        """Wiring for ``settings``: the given ``store``/``dispatcher``, or ones made from the
        settings (a ``Store`` on ``FLEET_REDIS_URL`` and ``FLEET_KEY_PREFIX``; a Celery app of
        the fleet's configuration sending by task name). Raises ``SystemExit`` when one must
        be made and no valid Redis URL is set. Nothing connects until first used."""
        owned: list[Any] = []
        if store is None:
            store = Store(checked_redis_url(settings), settings.key_prefix, settings=settings)
            owned.append(store)
        if dispatcher is None:
            checked_redis_url(settings)
            made = celery_dispatcher(settings)
            owned.append(made.app)
            dispatcher = made
        return cls(settings, store, dispatcher, owned)

    def close(self) -> None:
        """Finish the queued bookkeeping, then release the connections of what ``build`` made
        (at the application's shutdown)."""
        self.background.close()
        for item in self.owned:
            item.close()


def wiring(conn: HTTPConnection) -> Wiring:
    """The ``Wiring`` of the application serving ``conn``."""
    found: Wiring = conn.app.state.fleet
    return found


async def _wiring(conn: HTTPConnection) -> Wiring:
    return wiring(conn)


async def _store(conn: HTTPConnection) -> Store:
    return wiring(conn).store


async def _dispatcher(conn: HTTPConnection) -> Dispatcher:
    return wiring(conn).dispatcher


async def _settings(conn: HTTPConnection) -> FleetSettings:
    return wiring(conn).settings


#: All three at once: one dependency for a hot route instead of three (each costs a solve).
WiringDep = Annotated[Wiring, Depends(_wiring)]
StoreDep = Annotated[Store, Depends(_store)]
DispatcherDep = Annotated[Dispatcher, Depends(_dispatcher)]
SettingsDep = Annotated[FleetSettings, Depends(_settings)]


class Unauthorized(Exception):
    """No valid bearer token; answered 401 ``unauthorized`` with ``WWW-Authenticate``."""


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` with the Bearer scheme (the
    scheme is case-insensitive, RFC 7235); compared in constant time."""
    scheme, _, supplied = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(supplied.strip().encode(), token.encode())


async def authorize(
    request: HTTPConnection,
    authorization: Annotated[str | None, Header()] = None,
) -> None:
    """Raise ``Unauthorized`` unless ``FLEET_API_TOKEN`` is empty or the request carries it.
    ``GET /events`` alone also takes it as ``?token=`` (``EventSource`` cannot send headers)."""
    token = wiring(request).settings.api_token
    if not token or bearer_ok(authorization, token):
        return
    if request.url.path == "/events" and request.scope.get("method") == "GET":
        supplied = request.query_params.get("token")
        if supplied is not None and hmac.compare_digest(supplied.encode(), token.encode()):
            return
    raise Unauthorized()


#: The dependency list of every guarded router.
AUTH = [Depends(authorize)]


class UnsupportedMediaType(Exception):
    """A body sent without a JSON ``Content-Type`` to a route that takes a JSON body;
    answered 415 ``unsupported_media_type``. ``content_type`` is the type sent, if any."""

    def __init__(self, content_type: str | None) -> None:
        super().__init__(content_type)
        self.content_type = content_type


def _utf8_query(raw: bytes) -> None:
    """Refuse a query parameter whose name or value is not UTF-8 once its ``%XX`` escapes are
    decoded (``?q=%ff``): the server would read the bad bytes as U+FFFD and answer another
    question (an empty list) without a word."""
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            decoded = unquote_to_bytes(part.replace(b"+", b" "))
            try:
                decoded.decode("utf-8")
            except UnicodeDecodeError as exc:
                shown = unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8", "replace")
                raise InvalidParams(
                    f"query parameter {shown[:80]!r} is not UTF-8 once its %XX escapes are "
                    f"decoded: {untrusted.not_utf8(decoded, exc)}; percent-encode its UTF-8 "
                    "bytes.",
                    {"param": shown[:80], "offset": exc.start},
                ) from None


def _single_valued(request: HTTPConnection) -> None:
    """Refuse a query parameter given twice (``?archived=only&archived=include``): taking one
    of them silently would answer a question the caller did not ask."""
    for name in request.query_params:
        if len(request.query_params.getlist(name)) > 1:
            raise InvalidParams(
                f"query parameter {name!r} was given more than once.", {"param": name}
            )


#: Query parameters read by hand rather than declared, by route path: ``authorize`` reads
#: ``token`` on ``GET /events`` (``EventSource`` sends no headers).
HAND_READ_QUERY: dict[str, frozenset[str]] = {"/events": frozenset({"token"})}
#: Routes whose query string is not checked: the probes, whose answer no query can change
#: and whose callers (load balancers, uptime checks) may add a cache-busting one.
PROBES = frozenset({"/health", "/ready"})
#: Where ``query_names`` keeps a route's names on the route (routes are not hashable).
_TAKEN = "_fleet_query_names"


def query_names(route: Any) -> tuple[str, ...]:
    """The query parameters ``route`` takes, in the order declared: those its dependencies
    declare (by alias: the route's own, then every sub-dependency's), then those of
    ``HAND_READ_QUERY``. Worked out once per route."""
    taken: tuple[str, ...] | None = getattr(route, _TAKEN, None)
    if taken is None:
        names: dict[str, None] = {}
        stack = [route.dependant]
        while stack:
            dependant = stack.pop()
            names.update(dict.fromkeys(field.alias for field in dependant.query_params))
            stack.extend(reversed(dependant.dependencies))
        names.update(dict.fromkeys(sorted(HAND_READ_QUERY.get(route.path, ()))))
        taken = tuple(names)
        setattr(route, _TAKEN, taken)
    return taken


def _suggestion(name: str, taken: tuple[str, ...]) -> str:
    """`` (did you mean 'sessionId'?)`` for the name of ``taken`` that ``name`` is closest to
    (the same but for case, else a close spelling); '' when none is close."""
    lowered = {t.lower(): t for t in taken}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def _known_query(request: HTTPConnection, route: Any) -> None:
    """Refuse a query parameter ``route`` does not take (``?sessionid=`` for ``sessionId``,
    ``?archive=only``): ignoring it would answer another question (the whole fleet's events,
    the active sessions) as if it were the one asked."""
    taken = query_names(route)
    for name in request.query_params:
        if name in taken:
            continue
        shown = name[:80]
        method = request.scope.get("method")
        where = f"{method} {route.path}" if method else route.path
        takes = f"it takes {', '.join(taken)}" if taken else "it takes no query parameters"
        raise InvalidParams(
            f"query parameter {shown!r} is not taken by {where}{_suggestion(name, taken)}; "
            f"{takes}.",
            {"param": shown, "accepted": list(taken)},
        )


async def strict_request(request: HTTPConnection) -> None:
    """What every route checks before its own parameters, as one app-wide dependency (one
    solve per request): no query parameter that is not UTF-8 once decoded (``_utf8_query``),
    given twice (``_single_valued``) nor one the route does not take (``_known_query``), and
    a route that takes a JSON body gets a non-empty body only as JSON (``is_json_type``):
    curl's ``-d`` sends a form type, which the route would refuse as "not a valid dictionary"
    without a word about the type; nor the JSON ``null``, which FastAPI would take for no
    body. A body-less request passes. (``HTTPConnection``, not
    ``Request``: it also runs for the ``/acp`` WebSocket.)"""
    route = request.scope.get("route")
    if raw := request.scope.get("query_string"):
        probe = route is not None and route.path in PROBES
        if b"%" in raw and not probe:
            _utf8_query(raw)
        _single_valued(request)
        if route is not None and not probe:
            _known_query(request, route)
    if isinstance(request, Request) and getattr(route, "body_field", None) is not None:
        content_type = request.headers.get("content-type")
        # FastAPI has read the body already (cached): no second read.
        body = await request.body()
        if not is_json_type(content_type) and body:
            raise UnsupportedMediaType(content_type)
        if body.strip() == b"null":  # FastAPI reads it as no body: an optional one passes
            raise InvalidParams(
                "The request body must be a JSON object, or no body at all (got null).",
                {"param": "body"},
            )
