"""ASGI middleware guarding the HTTP API before any route runs: which names the API answers
to without a token (``HostGuard``: DNS rebinding), what a request may carry (``BodyGuard``:
size and JSON limits) and which browser pages may change state (``OriginGuard``). Refusals use
the one error shape of ``api/errors.py``."""

from __future__ import annotations

import ipaddress
import json
import re
from email.message import Message
from typing import Any
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse

from api.errors import error_body
from orchestrator import untrusted
from orchestrator.errors import DuplicateKey, InputRejected

#: HTTP methods that change state: a browser page of another origin may not send them.
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
#: Largest HTTP request body the API reads, in bytes (1 MiB); ``BodyGuard``'s default.
MAX_BODY_BYTES = 1_048_576
#: A bracketed IPv6 ``Host``: after ``]`` nothing but an optional ``:<digits>`` port.
_BRACKETED = re.compile(r"\[[^\[\]]*\](?::[0-9]*)?")
#: Headers a request may give at most once: a server and a proxy (or the guards and the
#: route) could each read another of them (RFC 9110 5.3: neither is a list).
SINGLE = (b"host", b"origin")


async def _answer(send: Any, status: int, body: dict[str, Any], close: bool = False) -> None:
    headers = {"Connection": "close"} if close else None
    response = JSONResponse(body, status_code=status, headers=headers)
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def _header(scope: Any, name: bytes) -> str | None:
    value = None
    for key, raw in scope.get("headers") or ():
        if key.lower() == name:
            value = raw.decode("latin-1")
    return value


def _repeated(scope: Any, names: tuple[bytes, ...]) -> bytes | None:
    """The first of ``names`` (lower-case) that an ASGI ``scope`` gives more than once."""
    seen: set[bytes] = set()
    for raw_key, _raw in scope.get("headers") or ():
        key = bytes(raw_key).lower()
        if key in names:
            if key in seen:
                return key
            seen.add(key)
    return None


def is_json_type(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this type as JSON: ``application/json`` or
    ``application/*+json``, parameters aside; a body with no type is not read (FastAPI's
    ``strict_content_type``, on by default: a browser can send one cross-site unpreflighted)."""
    if not content_type:
        return False
    if content_type == "application/json":
        return True  # nearly every request: no header parsing
    message = Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


class BodyGuard:
    """A request body larger than ``max_bytes`` (``MAX_BODY_BYTES``, 1 MiB) answers 413
    ``body_too_large``: a declared ``Content-Length`` over the cap is refused before anything
    is read; a body without one (chunked) is read up to the cap and refused as soon as it goes
    past it. A body FastAPI will read as JSON (``is_json_type``) is then parsed by
    ``orchestrator.untrusted``: JSON over a limit (nesting depth, number length, a number not
    finite: ``NaN`` and ``Infinity`` too) answers 400 ``input_rejected`` naming the limit and
    where; an object giving a key twice 422
    ``invalid_params`` naming it (``data.param``) and where (``data.path``); a lone surrogate
    anywhere in it 422 ``invalid_params`` (answers echo what was sent, and such text cannot be
    encoded); bytes that are not UTF-8 (JSON's one encoding, RFC 8259) 422 ``invalid_params``
    saying where; other invalid JSON goes on to the route's own 422. A body of another type
    is left to the route (``deps.strict_request``: 415 where a JSON body is taken).
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.max_bytes
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > cap
            except ValueError:
                too_big = False  # the server rejects a malformed Content-Length itself
            if too_big:
                await self._too_large(send, cap)
                return
        chunks: list[bytes] = []
        size = 0
        first: dict[str, Any] | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                first = message  # the client left: pass that on
                break
            body = message.get("body", b"")
            size += len(body)
            if size > cap:
                await self._too_large(send, cap)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        if first is None and whole and is_json_type(_header(scope, b"content-type")):
            refusal = self._check_json(whole)
            if refusal is not None:
                await _answer(send, *refusal)
                return
        replay: list[dict[str, Any]] = [
            first or {"type": "http.request", "body": whole, "more_body": False}
        ]

        async def replayed() -> Any:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    @staticmethod
    def _check_json(body: bytes) -> tuple[int, dict[str, Any]] | None:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            # Starlette would fail to decode it and FastAPI answer a bare 400 http_error.
            why = untrusted.not_utf8(body, exc)
            message = f"Request body is not valid UTF-8 JSON: {why}."
            data = {"param": "body", "offset": exc.start}
            return 422, error_body("invalid_params", message, data)
        try:
            value = untrusted.loads(text, param="body")
        except json.JSONDecodeError:
            return None  # FastAPI answers it: 422 invalid_params with the parser's message
        except InputRejected as exc:
            return 400, error_body(exc.code, exc.message, exc.data)
        except DuplicateKey as exc:
            return 422, error_body(exc.code, exc.message, exc.data)
        where = untrusted.lone_surrogate(value) if b"\\u" in body else None
        if where is None:
            return None
        message = f"Request body at {where}: text is not valid Unicode (a lone surrogate)."
        return 422, error_body("invalid_params", message, {"param": "body", "path": where})

    @staticmethod
    async def _too_large(send: Any, cap: int) -> None:
        body = error_body(
            "body_too_large",
            f"Request body is larger than {cap} bytes.",
            {"maxBytes": cap},
        )
        await _answer(send, 413, body, close=True)


def _host_name(host: str) -> str | None:
    """The name a ``Host`` header value (or an address) gives: lower-cased, without port,
    brackets or trailing dot; ``None`` for anything that is not ``name[:port]``."""
    text = host.strip()
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"  # a bare IPv6 address (FLEET_API_HOST=::1)
    if text.startswith("[") and not _BRACKETED.fullmatch(text):
        return None  # "[::1]evil", "[::1].evil.example": urlsplit reads them as [::1]
    try:
        parts = urlsplit(f"http://{text}")
        _ = parts.port  # raises for a port that is not a number
    except ValueError:
        return None
    if parts.path or parts.query or parts.fragment or parts.username is not None:
        return None
    name = (parts.hostname or "").rstrip(".")
    return name or None


def is_loopback(name: str) -> bool:
    """Whether a ``_host_name`` names this machine's loopback: ``localhost``, an address of
    ``127.0.0.0/8`` or ``::1``. No DNS answer can rebind these: browsers resolve them
    locally."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(raw: str, bind: str) -> frozenset[str]:
    """The names (``_host_name``) of ``raw`` (``FLEET_API_ALLOWED_HOSTS``: comma-separated,
    ports ignored) and ``bind`` (``FLEET_API_HOST``) unless it is an unspecified address
    (``0.0.0.0``, ``::``: every address, which names none); anything that is not a host name
    is left out."""
    found = {_host_name(item) for item in raw.split(",") if item.strip()}
    bound = _host_name(bind) if bind.strip() else None
    try:
        unspecified = bound is not None and ipaddress.ip_address(bound).is_unspecified
    except ValueError:
        unspecified = False
    if not unspecified:
        found.add(bound)
    return frozenset(name for name in found if name is not None)


def host_named(host: str | None, hosts: frozenset[str]) -> bool:
    """Whether a ``Host`` header value names this server: loopback (``is_loopback``) or one
    of ``hosts`` (``allowed_hosts``), any port. No ``Host`` at all (HTTP/1.0 allows it) names
    nothing: every client of the API (browsers, the CLI, httpx, curl) sends one."""
    if host is None:
        return False
    name = _host_name(host)
    return name is not None and (is_loopback(name) or name in hosts)


def host_allowed(scope: Any, hosts: frozenset[str]) -> bool:
    """``host_named`` for the ``Host`` header of an ASGI ``scope``."""
    return host_named(_header(scope, b"host"), hosts)


async def _refuse(
    scope: Any, receive: Any, send: Any, status: int, body: dict[str, Any], reason: str
) -> None:
    """Refuse an HTTP request (``status``, ``body``) or a WebSocket handshake: accepted, then
    at once closed with 1008 (policy violation) and ``reason`` (at most 123 bytes, RFC 6455
    5.5), before anything is read from it. A close before accepting reaches a browser as a
    bare 403 with no code or reason (ASGI), which says nothing to whoever debugs the page."""
    if scope["type"] == "http":
        await _answer(send, status, body)
        return
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1008, "reason": reason})


class HostGuard:
    """DNS rebinding: without a token, a page whose DNS name is made to point at this machine
    is of its own origin to the browser, which then sends its requests here with that name in
    ``Host``. So without a token every HTTP request and WebSocket handshake (``/acp``,
    ``/events`` alike) whose ``Host`` is not allowed (``host_allowed``), or that has none, is
    refused: HTTP with 403 ``host_forbidden``, a WebSocket closed with 1008. Token or not, a
    request giving ``Host`` or ``Origin`` more than once is refused (HTTP 400
    ``duplicate_header``, ``data.header`` the name; a WebSocket closed with 1008): which one
    counts would be the reader's guess. ``hosts`` is ``allowed_hosts`` of the
    settings, or ``None`` when a token is set (every name is served: a page without the
    token can do nothing)."""

    def __init__(self, app: Any, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        repeated = _repeated(scope, SINGLE)
        if repeated is not None:
            name = repeated.decode("latin-1")
            text = f"The request gives the {name.capitalize()} header more than once: send it once."
            body = error_body("duplicate_header", text, {"header": name})
            reason = f"duplicate_header: {name} given more than once."
            await _refuse(scope, receive, send, 400, body, reason)
            return
        if self.hosts is None or host_allowed(scope, self.hosts):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        shown = "no Host header" if host is None else f"Host {host[:200]!r}"
        text = (
            f"{shown} is not a name of this API: with no FLEET_API_TOKEN set only "
            "loopback names (localhost, 127.0.0.1, [::1]), FLEET_API_HOST and the names listed "
            "in FLEET_API_ALLOWED_HOSTS are served."
        )
        reason = "host_forbidden: list this name in FLEET_API_ALLOWED_HOSTS or set a token."
        body = error_body("host_forbidden", text, {"host": None if host is None else host[:200]})
        await _refuse(scope, receive, send, 403, body, reason)


def _origin_tuple(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin or URL, lower-cased, default port filled in;
    ``None`` for anything that is not an http(s)/ws(s) origin (``null`` included)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def origin_text(origin: tuple[str, str, int]) -> str:
    """An ``_origin_tuple`` as a browser writes it in ``Origin`` (no default port)."""
    scheme, host, port = origin
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + ("" if port == _DEFAULT_PORTS[scheme] else f":{port}")


def allowed_origins(raw: str) -> frozenset[tuple[str, str, int]]:
    """The origins of ``raw`` (``FLEET_API_ALLOWED_ORIGINS``: comma-separated), as
    ``_origin_tuple``s; anything that is not an http(s)/ws(s) origin is left out."""
    found = (_origin_tuple(item) for item in raw.split(",") if item.strip())
    return frozenset(origin for origin in found if origin is not None)


def origin_allowed(
    scope: Any, allowed: frozenset[tuple[str, str, int]], hosts: frozenset[str] | None = None
) -> bool:
    """Whether a request may go on as far as its ``Origin`` header is concerned: no header
    (not a browser), the API's own origin (the scheme it is served on and its ``Host``, when
    ``hosts`` is ``None`` (a token is required) or that ``Host`` is one of them
    (``host_allowed``): a page whose DNS name was rebound to this machine sends its own name
    as both), or one in ``allowed`` (``FLEET_API_ALLOWED_ORIGINS``)."""
    origin = _header(scope, b"origin")
    if origin is None:
        return True
    claimed = _origin_tuple(origin)
    if claimed is None:
        return False  # "null" (sandboxed frames, file:) or garbage: never our own page
    host = _header(scope, b"host")
    if host is not None and (hosts is None or host_allowed(scope, hosts)):
        own = _origin_tuple(f"{scope.get('scheme', 'http')}://{host}")
        if own is not None and own == claimed:
            return True
    return claimed in allowed


def _refusal_text(origin: str) -> str:
    return (
        f"Origin {origin[:200]!r} may not use this API from a browser: only pages of the API's "
        "own origin (the console) or of an origin listed in FLEET_API_ALLOWED_ORIGINS may."
    )


class OriginGuard:
    """Cross-site request forgery and WebSocket hijacking: a state-changing HTTP request
    (POST, PUT, PATCH, DELETE) or a WebSocket handshake (``/acp``, ``/events``) whose
    ``Origin`` is not allowed (``origin_allowed``) is refused, with or without a token: HTTP
    with 403 ``origin_forbidden``, the WebSocket accepted and at once closed with 1008 (policy
    violation) and the reason, before anything is read from it. Reads (GET) are left to
    the browser's same-origin policy. ``allowed`` is ``allowed_origins`` of the settings,
    ``hosts`` as ``HostGuard`` takes it."""

    def __init__(
        self,
        app: Any,
        allowed: frozenset[tuple[str, str, int]],
        hosts: frozenset[str] | None = None,
    ) -> None:
        self.app = app
        self.allowed = allowed
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        guarded = kind == "websocket" or (kind == "http" and scope["method"] in STATE_CHANGING)
        if not guarded or origin_allowed(scope, self.allowed, self.hosts):
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        text = _refusal_text(origin or "")
        body = error_body("origin_forbidden", text, {"origin": origin})
        reason = "origin_forbidden: set FLEET_API_ALLOWED_ORIGINS to allow this page."
        await _refuse(scope, receive, send, 403, body, reason)
