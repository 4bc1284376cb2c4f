"""What every benchmark shares: a private Redis per run, the store and dispatcher pointed at
it, the seeding of busy sessions, the HTTP API in its own process, and the figures' format."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

Row = tuple[str, str, str, str]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


#: The fixed workload of ``cpu_reference``: a JSON document about the size of an archive's
#: answer and stop messages, encoded and decoded this many times.
_REFERENCE_DOC = {f"k{i}": {"id": f"turn-{i:032x}", "n": i, "on": i % 2 == 0} for i in range(40)}
_REFERENCE_ROUNDS = 400


def cpu_reference(repeats: int = 9) -> float:
    """Seconds one fixed, CPU-only Python workload takes now (median of ``repeats``): JSON
    round trips of a small document, no I/O. The same code on the same interpreter takes the
    same CPU anywhere, so its time says how fast this machine runs Python at this moment:
    quoted beside a run's figures, it lets two runs (or two machines) be compared."""

    def workload() -> None:
        for _ in range(_REFERENCE_ROUNDS):
            json.loads(json.dumps(_REFERENCE_DOC))

    return statistics.median(timed(workload, repeats))


class NullDispatcher:
    """Seeds state without sending anything."""

    def send(self, task: str, args: list[Any], queue: str) -> None:
        return None


@contextmanager
def environment(url: str | None) -> Iterator[tuple[str, str]]:
    """(redis url, key prefix) for a run; a private embedded server unless ``url``."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    if url:
        try:
            yield url, prefix
        finally:
            client = redis.Redis.from_url(url)
            for key in client.scan_iter(match=f"{prefix}*", count=5000):
                client.delete(key)
        return
    from localfleet.embedded import EmbeddedRedis

    with EmbeddedRedis(Path(tempfile.mkdtemp(prefix="fleet-bench-"))) as server:
        embedded_urls.add(server.url)
        try:
            yield server.url, prefix
        finally:
            embedded_urls.discard(server.url)


#: URLs of the private servers ``environment`` runs now (only these may have fsync relaxed).
embedded_urls: set[str] = set()


@contextmanager
def fsync_relaxed(url: str) -> Iterator[bool]:
    """For seeding only: on a private server of ``environment``, ``appendfsync everysec`` in
    the block and ``always`` again after it, so no measurement runs relaxed; any other server
    is left as it is. Yields whether fsync was relaxed."""
    if url not in embedded_urls:
        yield False
        return
    raw = redis.Redis.from_url(url)
    raw.config_set("appendfsync", "everysec")
    try:
        yield True
    finally:
        raw.config_set("appendfsync", "always")
        raw.close()


def configure(url: str, prefix: str, **settings_fields: Any) -> tuple[Any, Any]:
    """The store and a dispatcher (its own Celery app) for the run's Redis and prefix;
    ``settings_fields`` on top of the default settings."""
    from api.wiring import celery_dispatcher
    from orchestrator.settings import FleetSettings
    from orchestrator.storage.store import Store

    settings = FleetSettings(redis_url=url, key_prefix=prefix, **settings_fields)
    return Store(url, prefix, settings=settings), celery_dispatcher(settings)


def seed_busy(store: Any, n: int, cwd: str = "/bench/busy", host: str = "bench-host") -> list[str]:
    """``n`` sessions in ``cwd`` with stored live work in all four families (no workers
    needed)."""
    from orchestrator.job import jobs
    from orchestrator.job import scripts as job_scripts
    from orchestrator.reminder import reminders
    from orchestrator.session import sessions
    from orchestrator.storage.store import iso, now_ms
    from orchestrator.turn import turns

    null = NullDispatcher()
    ids = []
    for _ in range(n):
        sid = sessions.create_session(store, cwd).session_id
        turns.start_turn(store, null, sid, "think 600")
        jid = jobs.create_job(store, null, sid, 600, "sleep 600s")
        job_scripts.job_claim(
            store,
            job_id=jid,
            host=host,
            lease_ms=600_000,
            now_iso=iso(now_ms()),
            instance=f"{host}/bench",
            max_per_host=10**9,
            limit_template="limit %d",
        )
        reminders.create_reminder(store, sid, 3600, "say later")
        child = sessions.create_session(store, cwd, parent_id=sid).session_id
        turns.start_turn(store, null, child, "think 600", source="subagent")
        ids.append(sid)
    return ids


def seed_busy_many(
    store: Any, n: int, cwd: str = "/bench/busy", per_host: int = 250, threads: int = 4
) -> list[str]:
    """``seed_busy`` for ``n`` sessions from ``threads`` threads in chunks of 250, a job host
    per ``per_host`` sessions (a job's claim counts its host's live jobs, so one host for all
    would make seeding quadratic); the ids in chunk order."""
    from concurrent.futures import ThreadPoolExecutor

    tag = uuid.uuid4().hex[:6]
    chunk = min(250, per_host)
    with ThreadPoolExecutor(threads) as pool:
        futures = [
            pool.submit(seed_busy, store, min(chunk, n - i), cwd, f"bench-{tag}-{i // per_host}")
            for i in range(0, n, chunk)
        ]
        return [sid for f in futures for sid in f.result()]


@contextmanager
def api_server(
    url: str, prefix: str, workers: int = 1, extra_env: dict[str, str] | None = None
) -> Iterator[str]:
    """The HTTP API (uvicorn, in its own process; ``workers`` processes behind one socket when
    more than one; ``extra_env`` on top of its settings) on a free port; yields its base URL."""
    port = free_port()
    env = dict(os.environ, FLEET_REDIS_URL=url, FLEET_KEY_PREFIX=prefix, FLEET_API_TOKEN="")
    env.update(extra_env or {})
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "api.rest:create_app",
        "--factory",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *(["--workers", str(workers)] if workers > 1 else []),
    ]
    api = subprocess.Popen(cmd, env=env)
    api_pids.append(api.pid)
    try:
        base = f"http://127.0.0.1:{port}"
        until(lambda: _ok(base + "/health"), 30)
        yield base
    finally:
        api_pids.remove(api.pid)
        api.terminate()
        api.wait(10)


#: Process ids of the API servers ``api_server`` runs now (for CPU accounting).
api_pids: list[int] = []


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants, from ``/proc`` (Linux)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def until(predicate: Callable[[], Any], timeout: float) -> None:
    """Wait until ``predicate()`` is truthy; raises ``TimeoutError`` after ``timeout`` s."""

    def timed_out(_: RetryCallState) -> None:
        raise TimeoutError(f"benchmark setup did not converge in {timeout}s")

    Retrying(
        stop=stop_after_delay(timeout),
        wait=wait_fixed(0.05),
        retry=retry_if_result(lambda value: not value),
        retry_error_callback=timed_out,
    )(predicate)


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core together, from ``/proc/stat`` (Linux)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextmanager
def machine_busy() -> Iterator[list[float]]:
    """How busy the machine's cores were over the block, in percent of all of them (every
    process counted, other users' too); the figure is in the yielded list after the block."""
    found: list[float] = []
    busy0, total0 = _cpu_ticks()
    yield found
    busy1, total1 = _cpu_ticks()
    found.append(100.0 * (busy1 - busy0) / max(1, total1 - total0))
