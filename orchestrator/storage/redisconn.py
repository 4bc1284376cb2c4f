"""Opening Redis clients from ``FLEET_REDIS_URL``: one Redis (``redis://``, ``rediss://``,
``unix://``) or a Sentinel-managed primary (``sentinel://``).

The Sentinel form is kombu's, so the same value serves the state store and the Celery broker::

    sentinel://[[user]:password@]host1:26379[/db];sentinel://host2:26379;sentinel://host3:26379

Each ``;``-separated address is one Sentinel. The credentials and the database number of the
first address are those of the Redis primary and its replicas (as kombu reads them); the
primary's name is ``FLEET_REDIS_SENTINEL_MASTER`` and the Sentinels' own credentials, when they
require any, are ``FLEET_REDIS_SENTINEL_AUTH`` (``user:password``).

A Sentinel-managed client asks the Sentinels for the primary's address whenever it opens a
connection, and drops its connections when the node it reaches answers as a replica
(``READONLY``), so a process follows a failover without a restart; during the switch its calls
fail with connection errors, which the store turns into ``StoreUnavailable``.

Every connection the fleet opens is bounded (``connection_options``): a reply that does not
come within its socket timeout is a ``redis.TimeoutError`` (the connection is dropped and the
next command opens a new one), and TCP keepalive probes a connection whose peer vanished
without a reset. Replies that mean "not now" rather than "wrong" (``TRANSIENT_REPLIES``:
loading, full, read-only, primary down, not enough replicas) are typed errors that every
caller retries as it retries a lost connection.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import MasterNotFoundError, Sentinel

from orchestrator.errors import StoreUnavailable
from orchestrator.settings import REDIS_SCHEMES, FleetSettings

#: URL schemes ``FLEET_REDIS_URL`` accepts.
SCHEMES = REDIS_SCHEMES
#: Port of a Sentinel address that names none.
SENTINEL_PORT = 26379


class NoReplicasError(redis.exceptions.ResponseError):
    """Raised (by redis-py, for any client of this process) when a primary configured with
    ``min-replicas-to-write`` refuses a write because too few replicas are connected
    (``NOREPLICAS``). The write was not applied; it passes once the replicas are back."""


# redis-py names a class per error code it knows and answers a bare ResponseError for the
# others; NOREPLICAS is not among them. Registered on the parsers' shared table (the same
# way redis-py registers its own codes), every client of the process raises the typed error:
# the store's, the event streams' and kombu's, whose transport counts it as a lost
# connection (workers/broker.py) instead of ending the worker.
BaseParser.EXCEPTION_CLASSES.setdefault("NOREPLICAS", NoReplicasError)

#: Server replies that mean "not now" rather than "wrong": the server is loading its data
#: (``LOADING``), full (``OOM``), a replica after a failover (``READONLY``), a replica whose
#: primary is down (``MASTERDOWN``), short of replicas under ``min-replicas-to-write``
#: (``NOREPLICAS``) or busy moving a key (``TRYAGAIN``). Retried by reconnecting, as a lost
#: connection is.
TRANSIENT_REPLIES: tuple[type[Exception], ...] = (
    redis.exceptions.BusyLoadingError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
    NoReplicasError,
)

#: TCP keepalive of every connection: the first probe after 5 s of silence, then one every
#: 2 s; 3 unanswered probes and the kernel reports the connection dead (about 11 s). This
#: finds a peer that vanished without a reset (a host gone, a NAT that dropped the flow);
#: a server that is reachable but never answers is found by the socket timeout.
KEEPALIVE_OPTIONS: dict[int, int] = {
    option: value
    for option, value in (
        (getattr(socket, "TCP_KEEPIDLE", None), 5),
        (getattr(socket, "TCP_KEEPINTVL", None), 2),
        (getattr(socket, "TCP_KEEPCNT", None), 3),
    )
    if option is not None
}


class SilenceProbe:
    """When a subscription (a pub/sub connection, which may rightly hear nothing for hours)
    should be PINGed, and when its silence means the connection is dead: one that died
    without a reset reads as "nothing published" forever. After ``after`` seconds with
    nothing read it asks for a PING; a PING unanswered for ``wait`` seconds more counts as
    a lost connection. ``clock`` is ``time.monotonic`` (seconds)."""

    def __init__(
        self,
        after: float = 5.0,
        wait: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after, self.wait, self._clock = after, wait, clock
        self._heard = clock()
        self._pinged = 0.0  # when an unanswered PING was sent; 0: none

    def step(self, heard: bool) -> bool:
        """Record one read (``heard``: it returned something, a PING's answer included);
        return whether to send a PING now. Raises ``redis.TimeoutError`` when a PING has gone
        unanswered for ``wait`` seconds (drop the subscription and make it again)."""
        now = self._clock()
        if heard:
            self._heard, self._pinged = now, 0.0
            return False
        if self._pinged:
            if now - self._pinged > self.wait:
                raise redis.TimeoutError(f"no answer to a PING in {self.wait:g} s")
            return False
        if now - self._heard > self.after:
            self._pinged = now
            return True
        return False


def connection_options(
    socket_timeout: float, connect_timeout: float, health_check_interval: int | None = None
) -> dict[str, Any]:
    """redis-py connection arguments bounding every wait: ``socket_timeout`` (seconds a reply
    may take), ``connect_timeout`` (seconds to connect), TCP keepalive
    (``KEEPALIVE_OPTIONS``) and, when given, ``health_check_interval`` (seconds a connection
    may sit idle before it is PINGed on its next use)."""
    found: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "socket_keepalive": True,
        "socket_keepalive_options": dict(KEEPALIVE_OPTIONS),
    }
    if health_check_interval is not None:
        found["health_check_interval"] = health_check_interval
    return found


@dataclass(frozen=True)
class SentinelOptions:
    """What a ``sentinel://`` URL does not carry: the primary's name as the Sentinels know it
    (``sentinel monitor <master> ...``) and the Sentinels' own credentials (empty: none)."""

    master: str = "mymaster"
    username: str = ""
    password: str = ""

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> SentinelOptions:
        """The options from ``FLEET_REDIS_SENTINEL_MASTER`` and ``FLEET_REDIS_SENTINEL_AUTH``
        (``user:password``; without a ``:``, a password alone)."""
        user, colon, password = settings.redis_sentinel_auth.partition(":")
        if not colon:
            user, password = "", user
        return cls(settings.redis_sentinel_master, user, password)

    def sentinel_kwargs(self, timeouts: dict[str, Any]) -> dict[str, Any]:
        """Connection arguments for the Sentinels themselves: ``timeouts`` plus credentials."""
        found = dict(timeouts)
        if self.username:
            found["username"] = self.username
        if self.password:
            found["password"] = self.password
        return found


@dataclass(frozen=True)
class SentinelAddress:
    """A parsed ``sentinel://`` URL: ``sentinels`` as ``(host, port)`` and the primary's
    connection arguments (``username``, ``password``, ``db``)."""

    sentinels: list[tuple[str, int]]
    db: int = 0
    username: str | None = None
    password: str | None = None

    def node_kwargs(self) -> dict[str, Any]:
        """Connection arguments for the primary (and replicas) the Sentinels name."""
        found: dict[str, Any] = {"db": self.db}
        if self.username:
            found["username"] = self.username
        if self.password:
            found["password"] = self.password
        return found


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names Sentinels rather than one Redis."""
    return url.strip().lower().startswith("sentinel://")


def parse_sentinel_url(url: str) -> SentinelAddress:
    """Parse ``sentinel://[[user]:password@]host:port[/db];sentinel://host:port;...``.

    Raises ``ValueError`` naming the part that is wrong (an address of another scheme, no
    host, a port or database that is not a number)."""
    sentinels: list[tuple[str, int]] = []
    first = None
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        parsed = urlsplit(part)
        if parsed.scheme.lower() != "sentinel" or not parsed.hostname:
            raise ValueError(f"{part!r} is not a sentinel://host:port address")
        try:
            port = parsed.port or SENTINEL_PORT
        except ValueError as exc:
            raise ValueError(f"{part!r} has a port that is not a number") from exc
        sentinels.append((parsed.hostname, port))
        first = first or parsed
    if first is None:
        raise ValueError("no sentinel://host:port address")
    path = first.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"database {path!r} is not a number")
    return SentinelAddress(
        sentinels,
        db=int(path or 0),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


def sync_client(url: str, options: SentinelOptions | None = None, **kwargs: Any) -> Any:
    """A redis-py client for ``url`` with ``kwargs`` (``decode_responses``, timeouts...) and
    TCP keepalive (``KEEPALIVE_OPTIONS``, unless ``kwargs`` say otherwise):
    ``Redis.from_url`` for one server, or the Sentinel-managed primary of
    ``options.master`` (``options``: the caller's, from its settings' ``FLEET_REDIS_SENTINEL_*``
    by ``SentinelOptions.from_settings``; none: ``SentinelOptions()``'s defaults). Raises
    ``ValueError`` for a malformed Sentinel URL."""
    kwargs = _with_keepalive(url, kwargs)
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **kwargs)
    return _primary(Sentinel, redis.Redis, url, options, kwargs)


def async_client(url: str, options: SentinelOptions | None = None, **kwargs: Any) -> Any:
    """As ``sync_client``, with ``redis.asyncio`` (for the API's event streams)."""
    kwargs = _with_keepalive(url, kwargs)
    if not is_sentinel(url):
        return aioredis.Redis.from_url(url, **kwargs)
    return _primary(AsyncSentinel, aioredis.Redis, url, options, kwargs)


def _with_keepalive(url: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with TCP keepalive added, or with it removed for a ``unix://`` URL (a
    local socket has none, and redis-py refuses the arguments there)."""
    if url.strip().lower().startswith("unix://"):
        return {k: v for k, v in kwargs.items() if not k.startswith("socket_keepalive")}
    return {"socket_keepalive": True, "socket_keepalive_options": dict(KEEPALIVE_OPTIONS), **kwargs}


def _primary(
    sentinel_class: Any,
    redis_class: Any,
    url: str,
    options: SentinelOptions | None,
    kwargs: dict[str, Any],
) -> Any:
    """The client of the primary the Sentinels of ``url`` name (sync or asyncio classes)."""
    opts = options or SentinelOptions()
    address = parse_sentinel_url(url)
    timeouts = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    sentinel = sentinel_class(
        address.sentinels,
        sentinel_kwargs=opts.sentinel_kwargs(timeouts),
        **address.node_kwargs(),
    )
    return sentinel.master_for(opts.master, redis_class=redis_class, **kwargs)


#: Replies of a Redis server that retrying cannot change: the URL or credentials are wrong.
_CONFIG_REPLIES = ("DB index is out of range", "NOAUTH", "WRONGPASS", "NOPERM", "invalid password")


def store_unavailable(exc: Exception) -> StoreUnavailable:
    """``exc`` (a redis-py or broker failure) as one line of ``StoreUnavailable``: the error's
    type and message, a Sentinel's pool repr left out, and no "try again" for a configuration
    error (a bad DB index, wrong or missing credentials)."""
    inner = exc.__cause__ or exc.__context__
    if not isinstance(exc, redis.RedisError) and isinstance(inner, redis.RedisError):
        exc = inner  # a broker error (kombu) wrapping the Redis one: say the Redis one
    text = " ".join(str(exc).split())
    if isinstance(exc, MasterNotFoundError):
        # "No master found for 'name' : <pool repr> - network:ConnectionError": name + cause.
        head, _, rest = text.partition(" : ")
        cause = rest.rpartition(" - ")[2] if " - " in rest else ""
        text = head + (f" (last error: {cause})" if cause else "")
    elif len(text) > 300:
        text = text[:300] + "..."
    configuration = isinstance(exc, redis.AuthenticationError) or (
        isinstance(exc, redis.ResponseError) and any(r in str(exc) for r in _CONFIG_REPLIES)
    )
    detail = type(exc).__name__ + (f" ({text.rstrip('. ')})" if text else "")
    return StoreUnavailable(detail, transient=not configuration)
