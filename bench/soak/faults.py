"""The fault schedule: seeded random faults, one at a time, each undone before the next; every
kind once (in a seeded order) before kinds are drawn by weight.

=================  ===========================================================================
``redis_kill``     SIGKILL of Redis, restarted on the same port after 0.3-2 s
``redis_stop``     SIGSTOP of Redis for 0.3-2.5 s, then SIGCONT
``worker_kill``    SIGKILL of one worker (any family, either job host), restarted after 0.3-2 s
``worker_stop``    SIGSTOP of one worker for 0.3-3 s, then SIGCONT
``squeeze``        ``CONFIG SET maxmemory`` below (or just above) the memory in use, policy
                   ``noeviction``, for 0.5-3 s, then ``maxmemory 0``
``api_kill``       SIGKILL of the HTTP API, restarted on the same port after 0.2-1.5 s
``freeze_archive`` SIGSTOP of the turn worker, archives with ``stopActivity`` of busy sessions
                   (``Faults.during_freeze``, the client's), SIGCONT 50 ms after the last 200
``escape``         a job and a shell call that leave processes outside their process group,
                   then an archive with ``stopActivity`` (``Faults.escape``: ``escapes.py``)
``net_freeze``     every connection open to Redis through the proxy (every worker's, the
                   API's, beat's) goes silent for good: nothing forwarded, nothing closed, no
                   reset; new connections work (``tests.tcp_proxy.TcpProxy.freeze_open``).
                   Closed (FIN) once frozen for ``FROZEN_FOR`` s, as a peer's kernel gives up
``noreplicas``     ``CONFIG SET min-replicas-to-write 1`` with no replica connected, for
                   0.5-3 s, then 0: every write is refused with ``NOREPLICAS``, as a primary's
                   whose replicas are gone
=================  ===========================================================================
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from bench.soak.procs import Processes

#: Fault kinds and their weights.
KINDS = {
    "redis_kill": 2,
    "redis_stop": 2,
    "worker_kill": 3,
    "worker_stop": 3,
    "squeeze": 2,
    "api_kill": 1,
    "freeze_archive": 2,
    "escape": 2,
    "net_freeze": 2,
    "noreplicas": 2,
}

#: Seconds after which a frozen connection is closed (bounds the proxy's threads in a long
#: soak; far longer than a process may take to notice the silence).
FROZEN_FOR = 60.0


@dataclass
class FaultLog:
    """What was done: ``(kind, target, started, ended)`` with wall-clock seconds."""

    events: list[tuple[str, str, float, float]] = field(default_factory=list)
    skipped: int = 0

    def counts(self) -> dict[str, int]:
        return dict(Counter(kind for kind, *_ in self.events))


class Faults:
    """Injects faults into ``procs`` on a seeded schedule until told to stop."""

    def __init__(
        self,
        procs: Processes,
        seed: int,
        gap: tuple[float, float] = (0.5, 2.5),
        during_freeze: Callable[[random.Random], None] | None = None,
        escape: Callable[[random.Random], str] | None = None,
    ):
        self.procs = procs
        self.during_freeze = during_freeze
        self.escape = escape
        self.rng = random.Random(seed)
        # The kinds have a generator of their own, so what a fault draws while it runs (which
        # can depend on the clock: a skipped fault draws less) never changes which come next.
        self._kinds = random.Random(seed)
        #: Every kind once, in a seeded order, before the weighted draws: any phase that fits
        #: len(KINDS) faults has run each kind.
        self._first_round = self._kinds.sample(list(KINDS), len(KINDS))
        self.gap = gap
        self.log = FaultLog()
        self._stop = threading.Event()

    def _admin(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.procs.redis.port,
            socket_timeout=2,
            socket_connect_timeout=1,
        )

    def _hold(self, low: float, high: float) -> None:
        self._stop.wait(self.rng.uniform(low, high))

    def _restart(self, name: str) -> None:
        for _ in range(20):
            try:
                self.procs.restart(name)
                return
            except RuntimeError:
                time.sleep(0.5)  # e.g. the old Redis still holds its port for a moment

    def one(self, kind: str) -> str:
        """Apply one fault of ``kind`` and undo it; returns its target (``""``: skipped)."""
        rng = self.rng
        if kind == "redis_kill":
            self.procs.signal("redis", signal.SIGKILL)
            self._hold(0.3, 2.0)
            self._restart("redis")
            return "redis"
        if kind == "redis_stop":
            if not self.procs.signal("redis", signal.SIGSTOP):
                return ""
            self._hold(0.3, 2.5)
            self.procs.signal("redis", signal.SIGCONT)
            return "redis"
        if kind in ("worker_kill", "worker_stop"):
            target = rng.choice(sorted(self.procs.worker_names()))
            if kind == "worker_kill":
                self.procs.signal(target, signal.SIGKILL)
                self._hold(0.3, 2.0)
                self._restart(target)
            else:
                self.procs.signal(target, signal.SIGSTOP)
                self._hold(0.3, 3.0)
                self.procs.signal(target, signal.SIGCONT)
            return target
        if kind == "squeeze":
            return self._squeeze()
        if kind == "freeze_archive":
            if self.during_freeze is None or not self.procs.signal("turn@soak", signal.SIGSTOP):
                return ""
            try:
                self.during_freeze(rng)
                time.sleep(0.05)
            finally:
                self.procs.signal("turn@soak", signal.SIGCONT)
            return "turn@soak"
        if kind == "escape":
            return self.escape(rng) if self.escape is not None else ""
        if kind == "net_freeze":
            self.procs.proxy.close_frozen(older_than=FROZEN_FOR)
            frozen = self.procs.proxy.freeze_open()
            self._hold(0.3, 1.5)
            return f"{frozen} connections" if frozen else ""
        if kind == "noreplicas":
            if not self._configure("min-replicas-to-write", 1):
                return ""
            self._hold(0.5, 3.0)
            self._reset("min-replicas-to-write", 0)
            return "redis"
        if kind == "api_kill":
            self.procs.signal("api", signal.SIGKILL)
            self._hold(0.2, 1.5)
            self._restart("api")
            return "api"
        raise ValueError(kind)

    def _squeeze(self) -> str:
        admin = self._admin()
        try:
            used = int(admin.info("memory")["used_memory"])
            tight = self.rng.random() < 0.5
            limit = used + 64 * 1024 if tight else max(1024 * 1024, used // 2)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", limit)
        except redis.RedisError:
            return ""
        finally:
            admin.close()
        self._hold(0.5, 3.0)
        self._reset("maxmemory", 0)
        return "redis(tight)" if tight else "redis(below use)"

    def _configure(self, name: str, value: int) -> bool:
        """``CONFIG SET name value`` once; whether Redis took it."""
        admin = self._admin()
        try:
            admin.config_set(name, value)
            return True
        except redis.RedisError:
            return False
        finally:
            admin.close()

    def _reset(self, name: str, value: int, timeout: float = 20.0) -> None:
        """``CONFIG SET name value``, retried while Redis is away (a restarted one has its
        defaults already)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._configure(name, value):
            time.sleep(0.2)

    def next_kind(self) -> str:
        """The next kind of the schedule: each kind once (seeded order), then drawn by weight."""
        if self._first_round:
            return self._first_round.pop(0)
        return self._kinds.choices(list(KINDS), list(KINDS.values()))[0]

    def run(self, until: float) -> None:
        """Inject faults until the monotonic time ``until`` (or ``stop``)."""
        while not self._stop.is_set() and time.monotonic() < until:
            self._hold(*self.gap)
            if self._stop.is_set() or time.monotonic() >= until:
                break
            kind = self.next_kind()
            started = time.time()
            target = self.one(kind)
            if target:
                self.log.events.append((kind, target, started, time.time()))
            else:
                self.log.skipped += 1

    def stop(self) -> None:
        self._stop.set()

    def release_all(self) -> None:
        """Undo every fault: SIGCONT to every process, every dead process restarted,
        ``maxmemory 0``, ``min-replicas-to-write 0``. Frozen connections stay frozen: the
        processes holding them must notice by themselves."""
        for name in list(self.procs.pids()):
            self.procs.signal(name, signal.SIGCONT)
        for name in ["redis", "api", "beat", *self.procs.worker_names()]:
            with contextlib.suppress(RuntimeError):
                self._restart(name)
        self._reset("maxmemory", 0)
        self._reset("min-replicas-to-write", 0)
