"""Benchmark 8: archive throughput under concurrency, one API process against two.

Closed loop: 32 clients archive busy sessions with ``stopActivity`` as fast as they are
answered, against one API process and then against two behind the same socket (``uvicorn
--workers 2``), each run on sessions seeded for it. The clients are lean so the figure measures
the API, not the load generator on the same cores: 32 keep-alive HTTP/1.1 connections in one
asyncio loop of the bench process (``bench.pacing.KeepAlive``). Reported: archives a second,
the latency median and p99, the API's CPU per archive (its processes' user + system time over
the run, from ``/proc``) and what it allows per core, Redis's and the load generator's CPU per
archive (the ceiling all three allow on the machine's cores), and how busy the machine's cores
were (``/proc/stat``, other users included): near 100%, the cores are the limit. The closed
loop judges the scaling of two processes over one.

Paced (open loop, ``bench.pacing``): Poisson arrivals at 100, 200, ... 500 archives a second
for 2 s over the same 32 connections, each archive on a busy session of its own, latency from
each request's scheduled time; the rates climb until the achieved one falls below 90% of the
offered one. Reported per rate: achieved rate, median, p99, the API's CPU per archive and the
machine's busy share; per process count, the highest rate sustained with p99 <= 20 ms. The
latency goal is judged here: a closed loop of 32 keeps 32 requests in flight (Little's law).
Seeding a private bench Redis runs with ``appendfsync everysec``; it is ``always`` again
before anything is measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import redis

from bench.common import (
    Row,
    api_pids,
    api_server,
    configure,
    cpu_seconds,
    embedded_urls,
    fsync_relaxed,
    machine_busy,
    ms,
    pct,
    seed_busy_many,
)
from bench.pacing import KeepAlive, Paced, climb, paced_rows, run_paced, schedule, sustainable

CLIENTS = 32
BODY = json.dumps({"stopActivity": True}).encode()
#: Offered rates of the paced runs (archives a second) and how long each lasts (seconds).
RATES = (100, 200, 300, 400, 500)
QUICK_RATES = (100, 200)
DURATION = 2.0


async def _client(host: str, port: int, mine: list[str], lat: list[float]) -> list[str]:
    """Archive ``mine`` one after another on one keep-alive connection; the failures."""
    conn = await KeepAlive.open(host, port)
    errors: list[str] = []
    try:
        for sid in mine:
            t0 = time.perf_counter()
            status, body = await conn.post(f"/sessions/{sid}/archive", BODY)
            lat.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(body[:200].decode(errors="replace"))
    finally:
        conn.close()
    return errors


def _run(base: str, ids: list[str]) -> tuple[float, list[float]]:
    """Archive ``ids`` from ``CLIENTS`` connections; (wall seconds, latencies)."""
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lat: list[float] = []

    async def all_clients() -> list[list[str]]:
        chunks = [ids[i::CLIENTS] for i in range(CLIENTS)]
        return await asyncio.gather(*(_client(host, port, c, lat) for c in chunks))

    t0 = time.perf_counter()
    failures = [e for errors in asyncio.run(all_clients()) for e in errors]
    wall = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"{len(failures)} archives failed, first: {failures[0]}")
    return wall, lat


def _redis_cpu(raw: redis.Redis) -> float:
    """The Redis server's user + system CPU seconds so far (``INFO cpu``)."""
    info = raw.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _seed(url: str, store: Any, n: int) -> list[str]:
    """``n`` busy sessions, seeded with fsync relaxed where that is allowed."""
    with fsync_relaxed(url):
        return seed_busy_many(store, n)


def _closed(url: str, store: Any, base: str, n: int) -> dict[str, Any]:
    """The closed loop over ``n`` fresh busy sessions against the API at ``base``."""
    ids = _seed(url, store, n)
    raw = redis.Redis.from_url(url)
    pid = api_pids[-1]
    cpu0, own0, redis0 = cpu_seconds(pid), time.process_time(), _redis_cpu(raw)
    with machine_busy() as busy:
        wall, lat = _run(base, ids)
    cpu, own = cpu_seconds(pid) - cpu0, time.process_time() - own0
    server = _redis_cpu(raw) - redis0
    return {
        "rate": n / wall,
        "median": statistics.median(lat),
        "p99": pct(lat, 0.99),
        "cpu": cpu / n,
        "client": own / n,
        "redis": server / n,
        "busy": busy[0],
    }


def _paced(url: str, store: Any, base: str, rate: float) -> Paced:
    """One paced run at ``rate`` archives a second, each on a busy session seeded for it."""
    arrivals = schedule(rate, DURATION)
    targets = [f"/sessions/{sid}/archive" for sid in _seed(url, store, len(arrivals))]
    pid = api_pids[-1]
    cpu0 = cpu_seconds(pid)
    with machine_busy() as busy:
        run = run_paced(base, targets, arrivals, DURATION, BODY, CLIENTS)
    run.cpu = (cpu_seconds(pid) - cpu0) / len(arrivals)
    run.busy = busy[0]
    return run


def _closed_row(workers: int, n: int, r: dict[str, Any], scale: float | None) -> Row:
    cores = os.cpu_count() or 1
    total = r["cpu"] + r["redis"] + r["client"]
    goal = ""
    if scale is not None:
        goal = f"; {scale:.2f}x one process; goal >= 1.6x: " + ("met" if scale >= 1.6 else "MISSED")
    return (
        f"8 archive with stop, {CLIENTS} clients (closed loop, one asyncio loop, keep-alive "
        f"HTTP/1.1), {workers} API process" + ("es" if workers > 1 else ""),
        f"n={n}",
        f"{r['rate']:.0f} archives/s, median {ms(r['median'])}, p99 {ms(r['p99'])}; "
        f"API CPU {ms(r['cpu'])} per archive ({1 / r['cpu']:.0f}/s per core)",
        f"machine {r['busy']:.0f}% busy ({cores} cores); CPU per archive: API "
        f"{ms(r['cpu'])} + Redis {ms(r['redis'])} + client {ms(r['client'])} = "
        f"{ms(total)}, a ceiling of {cores / total:.0f}/s on {cores} cores" + goal,
    )


def bench_concurrency(url: str, prefix: str, n: int, quick: bool = False) -> list[Row]:
    """Benchmark 8 (module docstring): closed loop of ``n`` archives against 1 and 2 API
    processes, then the paced rates (``--quick``: 100 and 200/s, 2 processes only)."""
    store, _ = configure(url, prefix)
    closed: dict[int, dict[str, Any]] = {}
    runs: dict[int, list[Paced]] = {}
    for workers in (1, 2):
        with api_server(url, prefix, workers=workers) as base:
            _run(base, _seed(url, store, 4 * workers))  # connected, scripts loaded
            closed[workers] = _closed(url, store, base, n)
            if workers == 2 or not quick:
                rates = QUICK_RATES if quick else RATES
                runs[workers] = climb(rates, partial(_paced, url, store, base))
    scale = closed[2]["rate"] / closed[1]["rate"]
    rows = [_closed_row(1, n, closed[1], None), _closed_row(2, n, closed[2], scale)]
    # Seeding ran at fsync everysec on the private server only (``fsync_relaxed``).
    seeding = ["seeded at appendfsync everysec, measured at always"] if url in embedded_urls else []
    for workers, found in runs.items():
        label = f"archive with stop, {CLIENTS} connections, {workers} API process" + (
            "es" if workers > 1 else ""
        )
        notes = list(seeding)
        if workers == 2:
            best = sustainable(found)
            met = best is not None and best.offered >= 500
            notes.insert(0, "goal >= 500/s at p99 <= 20 ms: " + ("met" if met else "MISSED"))
        rows.extend(paced_rows(label, found, DURATION, "; ".join(notes)))
    return rows
