"""The Redis seam: one client per process, Lua scripts, and the translation of redis-py errors
into ``StoreUnavailable``.

Idempotent reads are retried with tenacity for a short, bounded time (a failover or a restart
of Redis); writes are single Lua scripts, retried only where re-running them is harmless.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import redis
from redis.commands.core import Script
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from orchestrator.errors import WriteUnconfirmed
from orchestrator.settings import FleetSettings
from orchestrator.storage import lualink, luarules
from orchestrator.storage.keys import AUDIT_MAX_GLOBAL, AUDIT_MAX_PER_SESSION, Keys, lua_prelude
from orchestrator.storage.redisconn import (
    TRANSIENT_REPLIES,
    SentinelOptions,
    store_unavailable,
    sync_client,
)

P = ParamSpec("P")
T = TypeVar("T")

_TRANSIENT: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    *TRANSIENT_REPLIES,
)
_ORCHESTRATOR_DIR = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def _script_paths() -> dict[str, Path]:
    """Every Lua script of the store by name: ``<package>/<name>.lua`` in each package of
    ``orchestrator`` that owns it (the families' liveness rules, read by the registry, are not
    scripts). Raises ``RuntimeError`` when two packages hold a script of the same name."""
    found: dict[str, Path] = {}
    for path in sorted(_ORCHESTRATOR_DIR.glob("*/*.lua")):
        if path.parent.name == "families":
            continue
        if path.stem in found:
            raise RuntimeError(f"two scripts named {path.stem!r}: {found[path.stem]}, {path}")
        found[path.stem] = path
    return found


#: Milliseconds a lifecycle write waits for the ``FLEET_REDIS_MIN_REPLICAS_ACK`` replicas'
#: acknowledgements (Redis ``WAIT``) before it answers ``write_unconfirmed``.
REPLICA_ACK_TIMEOUT_MS = 1000


def now_ms() -> int:
    """This process's wall clock in integer epoch milliseconds. Never for a stored time or a
    decision (processes' clocks disagree): those use ``Store.now_ms`` (Redis ``TIME``)."""
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    """Format epoch milliseconds as ISO 8601 UTC with millisecond precision (``...Z``)."""
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def new_id(kind: str) -> str:
    """A fresh opaque id such as ``sess_3f2a...`` (kind + 24 hex digits)."""
    return f"{kind}_{uuid.uuid4().hex[:24]}"


@contextmanager
def translated() -> Iterator[None]:
    """Turn redis-py failures raised inside the block into ``StoreUnavailable``."""
    try:
        yield
    except redis.RedisError as exc:
        raise store_unavailable(exc) from exc


def retried(fn: Callable[P, T]) -> Callable[P, T]:
    """Retry an idempotent store operation on transient errors for up to 2 s, then raise
    ``StoreUnavailable``."""

    inner = retry(
        retry=retry_if_exception_type(_TRANSIENT),
        stop=stop_after_delay(2.0),
        wait=wait_exponential(multiplier=0.05, max=0.5),
        reraise=True,
    )(fn)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with translated():
            return inner(*args, **kwargs)

    return wrapper


@functools.lru_cache(maxsize=4)
def _prelude(version: int) -> list[lualink.Statement]:
    """The statements of every script's prelude for the families' registry ``version``: the
    key builders, the shared rules (``orchestrator/storage/luarules.py``), ``_lib.lua``, the
    families'
    liveness rules."""
    from orchestrator.families import registry

    lib = _script_paths()["_lib"].read_text(encoding="utf-8")
    parts = [lua_prelude(), luarules.lua_rules(), lib, registry.lua_rules(), ""]
    return lualink.statements("\n".join(parts))


@retried
def _server_ms(store: Store) -> int:
    seconds, micros = store.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Store:
    """A Redis client, the key schema bound to a prefix, and the loaded Lua scripts.

    ``url`` is a redis://, rediss://, unix:// or sentinel:// URL
    (``orchestrator.storage.redisconn``;
    ``sentinel`` defaults to ``settings``' ``FLEET_REDIS_SENTINEL_*``); timeouts are seconds
    and bound every call, so a dead server (or a connection that went silent) surfaces as
    ``StoreUnavailable`` instead of a hang; connections have TCP keepalive. With Sentinel the
    client follows the primary through a failover. ``settings``: the process's, as its entry
    point read them (none: ``FleetSettings()``, read once here).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        socket_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        settings: FleetSettings | None = None,
        sentinel: SentinelOptions | None = None,
        min_replicas_ack: int | None = None,
        replica_ack_timeout_ms: int | None = None,
        audit_max_per_session: int = AUDIT_MAX_PER_SESSION,
        audit_max_global: int = AUDIT_MAX_GLOBAL,
    ) -> None:
        self.url = url
        self.keys = Keys(prefix)
        read = settings if settings is not None else FleetSettings()
        self._settings = read
        #: Replicas that must acknowledge a durable write (``WAIT``) within the timeout (ms).
        self.min_replicas_ack = (
            read.redis_min_replicas_ack if min_replicas_ack is None else min_replicas_ack
        )
        self.replica_ack_timeout_ms = replica_ack_timeout_ms or REPLICA_ACK_TIMEOUT_MS
        #: Audit entries kept per session and fleet-wide (older ones are trimmed).
        self.audit_max_per_session = audit_max_per_session
        self.audit_max_global = audit_max_global
        #: The Sentinel options its clients use (``sentinel``, else from the settings).
        self.sentinel = sentinel if sentinel is not None else SentinelOptions.from_settings(read)
        # Typed as Any: redis-py annotates replies as unions over sync/async and bytes/str
        # modes; with decode_responses=True they are str, and callers check what they read.
        self.redis: Any = sync_client(
            url,
            self.sentinel,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=10,
        )
        self._scripts: dict[tuple[str, int], Script] = {}
        self._waitaof: bool | None = None

    @property
    def settings(self) -> FleetSettings:
        """The settings of the process this store serves, as its entry point read them and
        passed them in (``settings=``); when none were given, the environment's as they were
        when the store was made. The domain reads its limits, caps and waits here, so a process
        (or a test) with its own settings needs no process-global reset."""
        return self._settings

    def now_ms(self) -> int:
        """The Redis server's clock (``TIME``) in integer epoch milliseconds: the one clock
        every stored time and every time a decision compares comes from, so a process whose
        own clock is skewed decides as every other does (Lua scripts read the same clock with
        ``server_ms``). Read once per operation. Raises ``StoreUnavailable``."""
        return _server_ms(self)

    def script(self, name: str) -> Script:
        """Return the Lua script ``<name>.lua`` of the package that owns it, registered on the
        client,
        after its prelude: the key builders ``K`` (``keys.lua_prelude``), the shared states and
        entry builders (``luarules.lua_rules``), ``_lib.lua`` and each registered family's
        liveness rule (``orchestrator.families``), so every script reads key names from
        ``orchestrator/storage/keys.py`` and one liveness rule per family. Only the
        prelude's definitions the script reaches are put before it (``lualink``): Redis runs
        the whole source on every call."""
        from orchestrator.families import registry

        key = (name, registry.version())
        found = self._scripts.get(key)
        if found is None:
            body = _script_paths()[name].read_text(encoding="utf-8")
            found = self.redis.register_script(lualink.link(_prelude(key[1]), body))
            self._scripts[key] = found
        return found

    def run(self, name: str, args: list[Any], *, durable: bool = False) -> Any:
        """Run the Lua script ``name`` with ``[prefix, *args]`` as ARGV.

        With ``durable``, the reply is returned only once the write is fsynced to the
        append-only file where the server can confirm it (``WAITAOF``, Redis >= 7.2; older
        servers rely on their own ``appendfsync always`` configuration, which the embedded
        server uses) and, when ``min_replicas_ack`` > 0, acknowledged by that many replicas
        within ``replica_ack_timeout_ms`` (``WAIT``); both are sent on the same connection in
        one pipeline with the script (one round trip).
        Raises ``StoreUnavailable`` on any Redis failure, and ``WriteUnconfirmed`` (a
        ``StoreUnavailable``) when fewer replicas acknowledged: the write is on the primary
        and may or may not survive a failover.
        """
        argv = [self.keys.prefix, *args]
        script = self.script(name)
        with translated():
            if not durable or (self._waitaof is False and not self.min_replicas_ack):
                return script(keys=[], args=argv)
            result, *acks = self._pipelined(name, args)
            if isinstance(result, redis.exceptions.NoScriptError):
                # The server's script cache was emptied (a restart, a failover, SCRIPT FLUSH):
                # the script did not run. Load it and write once more.
                script.sha = self.redis.script_load(script.script)
                result, *acks = self._pipelined(name, args)
        if isinstance(result, Exception):
            with translated():
                raise result
        if self._waitaof is not False:
            self._check_waitaof(acks.pop(0))
        if self.min_replicas_ack:
            acked = acks.pop(0)
            if isinstance(acked, Exception):
                with translated():
                    raise acked
            if int(acked) < self.min_replicas_ack:
                raise WriteUnconfirmed(int(acked), self.min_replicas_ack)
        return result

    def queue_script(self, pipe: Any, name: str, args: list[Any]) -> None:
        """Queue the Lua script ``name`` with ``[prefix, *args]`` on a redis-py ``pipe`` by
        its digest (``EVALSHA``); send the pipeline with ``execute``. (A pipeline holding a
        redis-py ``Script`` asks the server ``SCRIPT EXISTS`` first: a round trip more.)"""
        pipe.evalsha(self.script(name).sha, 0, self.keys.prefix, *args)

    def execute(self, pipe: Any, *, raise_on_error: bool = False) -> list[Any]:
        """Send ``pipe`` (one round trip) and return its replies: errors among them, or with
        ``raise_on_error`` the first of them raised (the other commands were still sent). A
        script queued with ``queue_script`` that the server no longer has (``NOSCRIPT``: its
        cache was emptied by a restart, a failover or ``SCRIPT FLUSH``) did not run: it is
        loaded and run on its own after the others, and its reply (or error) takes the place
        of the refusal."""
        stack = list(pipe.command_stack)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                command = stack[i][0]  # ("EVALSHA", sha, numkeys, *args)
                script = next((s for s in self._scripts.values() if s.sha == command[1]), None)
                if script is None:  # not queued by queue_script: its refusal stays
                    continue
                try:
                    script.sha = self.redis.script_load(script.script)
                    replies[i] = self.redis.evalsha(script.sha, *command[2:])
                except redis.RedisError as exc:
                    replies[i] = exc
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _pipelined(self, name: str, args: list[Any]) -> list[Any]:
        """The script ``name`` (``queue_script``) with its ``WAITAOF`` and ``WAIT`` in one
        pipeline (one round trip); the replies, errors included."""
        pipe = self.redis.pipeline(transaction=False)
        self.queue_script(pipe, name, args)
        if self._waitaof is not False:
            pipe.execute_command("WAITAOF", 1, 0, 1000)
        if self.min_replicas_ack:
            pipe.execute_command("WAIT", self.min_replicas_ack, self.replica_ack_timeout_ms)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        return replies

    def _check_waitaof(self, ack: Any) -> None:
        if isinstance(ack, redis.ResponseError):
            # Unknown command (server < 7.2) or appendonly off: nothing more to wait for.
            self._waitaof = False
        elif isinstance(ack, Exception):
            with translated():
                raise ack
        else:
            self._waitaof = True

    def close(self) -> None:
        """Release the connection pool."""
        self.redis.close()
