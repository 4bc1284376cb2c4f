"""A Sentinel-managed Redis group on loopback for the failover test and benchmark: one primary,
replicas and Sentinels, each a ``redis-server`` process on a free port, with short Sentinel
timeouts (down after 1 s, failover timeout 3 s) so a failover completes in a few seconds.

Every node runs append-only with ``appendfsync always``, as the fleet's production topology
recommends, and starts a full resynchronisation at once (``repl-diskless-sync-delay 0``;
Redis waits 5 s by default for more replicas to share the transfer, which only delayed the
replicas' first sync here). Processes are signalled by PID only.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.common import free_port
from localfleet.embedded import find_redis_server
from orchestrator.process.processes import die_with_parent

MASTER = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


@dataclass
class Node:
    """One ``redis-server`` process (data node or Sentinel)."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    directory: Path

    def client(self, timeout: float = 2.0) -> Any:
        return redis.Redis(
            "127.0.0.1",
            self.port,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class SentinelGroup:
    """The group's nodes; ``url`` is the fleet's ``FLEET_REDIS_URL`` for it and ``master``
    its ``FLEET_REDIS_SENTINEL_MASTER``."""

    root: Path
    data: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)
    master: str = MASTER

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels)

    def env(self) -> dict[str, str]:
        """Environment that points a fleet process at the group."""
        return {"FLEET_REDIS_URL": self.url, "FLEET_REDIS_SENTINEL_MASTER": self.master}

    def _start(self, name: str, config: str, *, sentinel: bool = False) -> Node:
        directory = self.root / name
        directory.mkdir(parents=True)
        port = free_port()
        conf = directory / "node.conf"
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {directory}\n{config}")
        executable = find_redis_server()
        assert executable, "redis-server is needed"
        cmd = [executable, str(conf), *(["--sentinel"] if sentinel else [])]
        log = (directory / "out.log").open("ab")
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )
        node = Node(name, port, process, directory)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.RedisError):
                if node.client(0.5).ping():
                    return node
            assert node.alive, (directory / "out.log").read_text()
            assert time.monotonic() < deadline, f"{name} did not answer"
            time.sleep(0.05)

    def start(self, replicas: int = 2, sentinels: int = 3) -> SentinelGroup:
        durable = 'appendonly yes\nappendfsync always\nsave ""\nrepl-diskless-sync-delay 0\n'
        primary = self._start("primary", durable)
        self.data.append(primary)
        for i in range(replicas):
            self.data.append(
                self._start(f"replica{i + 1}", durable + f"replicaof 127.0.0.1 {primary.port}\n")
            )
        quorum = sentinels // 2 + 1
        for i in range(sentinels):
            self.sentinels.append(
                self._start(
                    f"sentinel{i + 1}",
                    f"sentinel monitor {self.master} 127.0.0.1 {primary.port} {quorum}\n"
                    f"sentinel down-after-milliseconds {self.master} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {self.master} {FAILOVER_TIMEOUT_MS}\n"
                    f"sentinel parallel-syncs {self.master} 1\n",
                    sentinel=True,
                )
            )
        self.wait_settled(replicas, sentinels)
        return self

    def wait_settled(self, replicas: int, sentinels: int, timeout: float = 30) -> None:
        """Until every replica is in sync and every Sentinel knows them and the others."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ok = all(self._sentinel_sees(s, replicas, sentinels) for s in self.sentinels)
                primary = self.primary()
                info = primary.client().info("replication")
                ok = ok and info.get("connected_slaves") == replicas
                ok = ok and all(info[f"slave{i}"]["state"] == "online" for i in range(replicas))
            except (redis.RedisError, KeyError):
                ok = False
            if ok:
                return
            assert time.monotonic() < deadline, "the Sentinel group did not settle"
            time.sleep(0.1)

    def _sentinel_sees(self, sentinel: Node, replicas: int, sentinels: int) -> bool:
        c = sentinel.client()
        seen = [r for r in c.sentinel_slaves(self.master) if "s_down" not in r["flags"]]
        return len(seen) == replicas and len(c.sentinel_sentinels(self.master)) == sentinels - 1

    def primary_address(self) -> tuple[str, int]:
        """The primary as the first answering Sentinel names it."""
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                host, port = s.client().sentinel_get_master_addr_by_name(self.master)
                return host, int(port)
        raise AssertionError("no Sentinel answers")

    def primary(self) -> Node:
        _, port = self.primary_address()
        [node] = [n for n in self.data if n.port == port]
        return node

    def cut_replication(self) -> None:
        """Make the replicas fall behind: stop them (SIGSTOP) and close their links on the
        primary, so what the primary writes from now on reaches no replica until they are
        continued (``signal_replicas(SIGCONT)``) and resynchronise."""
        self.signal_replicas(signal.SIGSTOP)
        self.primary().client().client_kill_filter(_type="replica")

    def signal_replicas(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every live replica (by PID): SIGSTOP makes them lag behind."""
        primary = self.primary()
        for node in self.data:
            if node is not primary and node.alive:
                node.process.send_signal(sig)

    def hang_primary(self) -> Node:
        """SIGSTOP the current primary's process (by PID): it keeps its connections open and
        answers nothing, as a hung host does; returns it (``SIGCONT`` it to end the hang)."""
        node = self.primary()
        node.process.send_signal(signal.SIGSTOP)
        return node

    def kill_primary(self) -> Node:
        """SIGKILL the current primary's process (by PID) and reap it; returns it."""
        node = self.primary()
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)
        return node

    def wait_promoted(self, old: Node, timeout: float = 30) -> Node:
        """Until the Sentinels name a live primary other than ``old`` that says it is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, ValueError, AssertionError):
                node = self.primary()
                if node is not old and node.client().info("replication")["role"] == "master":
                    return node
            time.sleep(0.05)
        raise AssertionError("no replica was promoted")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.data]:
            if node.alive:
                node.process.send_signal(signal.SIGCONT)
                node.process.send_signal(signal.SIGKILL)
                node.process.wait(10)


@contextlib.contextmanager
def sentinel_group(root: Path, replicas: int = 2, sentinels: int = 3) -> Iterator[SentinelGroup]:
    """A started ``SentinelGroup`` under ``root``, stopped afterwards."""
    group = SentinelGroup(root)
    try:
        yield group.start(replicas, sentinels)
    finally:
        group.stop()
