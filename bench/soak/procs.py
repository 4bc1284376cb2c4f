"""The processes a soak owns: a private Redis, the family workers, the HTTP API and beat.

Everything binds to 127.0.0.1. Redis is the embedded server (append-only, ``appendfsync
always``) on a fixed free port, so it comes back on the same address after a SIGKILL. The
workers, the API and beat reach it through a TCP proxy of the soak's own
(``tests.tcp_proxy.TcpProxy``), which can silence every connection open at a moment; the
soak's own reads go to Redis directly. Every signal the soak sends goes to one PID it
started; a process that exits without such a signal is recorded as an unexpected exit (and
restarted, so the soak goes on).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import free_port
from localfleet.embedded import EmbeddedRedis
from localfleet.fleet import LocalFleet, WorkerProcess
from orchestrator.families import names as family_names
from orchestrator.process.processes import die_with_parent
from tests.tcp_proxy import TcpProxy

#: Settings every soak process gets: short enough that a lost step or a dead worker is
#: noticed well inside the settle window (the defaults are sized for production).
SOAK_ENV = {
    "FLEET_VISIBILITY_TIMEOUT_SECONDS": "10",
    "FLEET_RECONCILE_INTERVAL_SECONDS": "2",
    "FLEET_RECONCILE_GRACE_SECONDS": "2",
    # A reminder fire whose publish failed (a producer connection frozen by net_freeze) is
    # claimed again after this; the default 30 s would outlast the settle window.
    "FLEET_REMINDER_REFIRE_SECONDS": "5",
    "FLEET_LOG_FORMAT": "json",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class Exit:
    """A process that exited without the soak asking: its name, code and log evidence."""

    name: str
    code: int | None
    at: float
    unrecoverable: list[str]


@dataclass
class Helper:
    """A non-worker process (the API or beat): how to start it and the running one."""

    name: str
    cmd: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Processes:
    """Start, signal, restart and watch every process of one soak.

    ``state_dir`` holds Redis's data and every log. ``token`` is the API's bearer token.
    ``exits`` collects exits the soak did not cause (``expect_exit`` marks a PID as killed on
    purpose before it is signalled).
    """

    state_dir: Path
    token: str
    prefix: str = "soak:"
    job_hosts: int = 2
    concurrency: int = 4
    redis: EmbeddedRedis = field(init=False)
    #: What every process of the fleet connects to instead of Redis.
    proxy: TcpProxy = field(init=False)
    fleet: LocalFleet = field(init=False)
    api: Helper = field(init=False)
    beat: Helper = field(init=False)
    api_port: int = field(init=False)
    exits: list[Exit] = field(default_factory=list)
    _expected: set[int] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _watching: bool = False
    _redis_pid: int = 0
    _spawner: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="soak-spawner")
    )

    def __post_init__(self) -> None:
        redis_port = free_port()
        self.redis = EmbeddedRedis(self.state_dir, port=redis_port)
        self.proxy = TcpProxy(redis_port)
        self.api_port = free_port()

    # ------------------------------------------------------------------ start / stop
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        """The environment of the API and beat (workers get the same through the fleet)."""
        env = dict(os.environ)
        env.update(SOAK_ENV)
        env.update(
            {
                "FLEET_REDIS_URL": self.proxy.url,
                "FLEET_KEY_PREFIX": self.prefix,
                "FLEET_API_TOKEN": self.token,
                "FLEET_STATE_DIR": str(self.state_dir),
            }
        )
        return env

    def start(self, timeout: float = 90.0) -> None:
        """Start Redis, the workers, the API and beat (on the spawner thread); wait until all
        are ready. Raises ``RuntimeError`` (with a log tail) when one does not come up."""
        self._spawner.submit(self._start).result()
        self.fleet.wait_ready(timeout)
        if not self.wait_api(timeout):
            raise RuntimeError(f"the API did not answer /health within {timeout:g}s")
        self._watching = True

    def _start(self) -> None:
        self.redis.start()
        self.proxy.start()
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.fleet = LocalFleet(
            self.proxy.url,
            self.prefix,
            self.state_dir,
            hostname="soak",
            job_hosts=self.job_hosts,
            concurrency=self.concurrency,
            extra_env=dict(SOAK_ENV),
        )
        self.fleet.start()
        py = sys.executable
        self.api = Helper(
            "api",
            [py, "-m", "api.cli", "api", "--host", "127.0.0.1", "--port", str(self.api_port)],
            logs / "api.log",
        )
        self.beat = Helper(
            "beat",
            [py, "-m", "api.cli", "beat", "--schedule-file", str(self.state_dir / "beat.db")],
            logs / "beat.log",
        )
        self._launch(self.api)
        self._launch(self.beat)

    def _launch(self, helper: Helper) -> None:
        with open(helper.log_path, "ab") as log_file:
            helper.process = subprocess.Popen(
                helper.cmd,
                env=self.env(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(signal.SIGKILL, new_session=False),
            )

    def wait_api(self, timeout: float) -> bool:
        """Poll ``/health`` until the API answers; whether it did within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + "/health", timeout=0.5).status_code == 200:
                    return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Stop everything (no exit is recorded from here on): SIGCONT first, so a stopped
        process can act on the SIGTERM."""
        with self._lock:
            self._watching = False
            for pid in self.pids().values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            self.fleet.stop(timeout=8)
        for helper in (self.api, self.beat):
            proc = helper.process
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(8)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.proxy.stop()
        self.redis.stop()
        self._spawner.shutdown(wait=True)

    # ------------------------------------------------------------------ signals
    def pids(self) -> dict[str, int]:
        """Name -> PID of every running process (``redis``, ``api``, ``beat``, and each
        worker by its node name: ``<family>@<host>``, ``<family>.ctl@<host>``)."""
        out: dict[str, int] = {}
        if self.redis.pid is not None:
            out["redis"] = self.redis.pid
        for helper in (self.api, self.beat):
            if helper.process is not None and helper.process.poll() is None:
                out[helper.name] = helper.process.pid
        for w in self.fleet.workers:
            if w.process.poll() is None:
                out[w.node] = w.process.pid
        return out

    def worker_names(self) -> list[str]:
        return [w.node for w in self.fleet.workers]

    def signal(self, name: str, sig: int) -> bool:
        """Send ``sig`` to the process ``name``; a SIGKILL is marked as the soak's own.
        Returns whether the process was running."""
        with self._lock:
            pid = self.pids().get(name)
            if pid is None:
                return False
            if sig == signal.SIGKILL:
                self._expected.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            return True

    def restart(self, name: str) -> None:
        """Start ``name`` again if it is not running (Redis on the same port). Runs on the
        spawner thread: children die with the thread that started them (PR_SET_PDEATHSIG),
        so they must not be started from a thread that ends before the soak does."""
        self._spawner.submit(self._restart, name).result()

    def _restart(self, name: str) -> None:
        with self._lock:
            if name == "redis":
                if not self.redis.running:
                    self.redis.start()
                return
            for helper in (self.api, self.beat):
                if helper.name == name:
                    if helper.process is None or helper.process.poll() is not None:
                        self._launch(helper)
                    return
            for i, w in enumerate(self.fleet.workers):
                if w.node == name and w.process.poll() is not None:
                    self.fleet.workers[i] = self.fleet.start_worker(
                        w.family, w.host, control=w.control, append=False
                    )

    # ------------------------------------------------------------------ watching
    def watch_once(self) -> None:
        """Record and restart every process that exited without the soak's SIGKILL."""
        with self._lock:
            if not self._watching:
                return
            dead: list[tuple[str, int, int | None, Path]] = []
            if self.redis.pid is not None:
                self._redis_pid = self.redis.pid
            elif self._redis_pid not in self._expected:
                dead.append(("redis", self._redis_pid, None, self.redis.log_path))
            for helper in (self.api, self.beat):
                proc = helper.process
                if proc is not None and proc.poll() is not None:
                    dead.append((helper.name, proc.pid, proc.returncode, helper.log_path))
            for w in self.fleet.workers:
                if w.process.poll() is not None:
                    name = w.node
                    dead.append((name, w.process.pid, w.process.returncode, w.log_path))
            for name, pid, code, log_path in dead:
                if pid in self._expected:
                    continue  # the fault that killed it restarts it
                self._expected.add(pid)  # recorded once
                self.exits.append(Exit(name, code, time.time(), unrecoverable_lines(log_path)))
                self._spawner.submit(self._restart, name)

    def watch(self, stop: threading.Event, every: float = 0.2) -> threading.Thread:
        """Run ``watch_once`` every ``every`` s on a thread until ``stop`` is set."""

        def loop() -> None:
            while not stop.wait(every):
                self.watch_once()

        thread = threading.Thread(target=loop, name="soak-watch", daemon=True)
        thread.start()
        return thread

    def log_paths(self) -> dict[str, Path]:
        """Name -> log file of every worker (current and replaced: same path) and helper."""
        out = {w.node: w.log_path for w in self.fleet.workers}
        out["api"] = self.api.log_path
        out["beat"] = self.beat.log_path
        return out

    def worker(self, name: str) -> WorkerProcess | None:
        for w in self.fleet.workers:
            if w.node == name:
                return w
        return None


def unrecoverable_lines(path: Path, limit: int = 3) -> list[str]:
    """The last ``limit`` lines of a log that mention "Unrecoverable error"."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if "Unrecoverable error" in line:
            with contextlib.suppress(ValueError, AttributeError):
                line = str(json.loads(line).get("message", line))
            found.append(line.strip()[:200])
    return found[-limit:]


FAMILIES = [str(name) for name in family_names()]
