"""Benchmark 8: archive throughput under concurrency, one API process against two.

32 clients archive busy sessions with ``stopActivity`` as fast as they are answered, against
one API process and then against two behind the same socket (``uvicorn --workers 2``), each
run on sessions seeded for it. The clients are lean so the figure measures the API, not the
load generator on the same cores: 32 keep-alive HTTP/1.1 connections in one asyncio loop of
the bench process (``h11`` speaks the protocol). Reported: archives a second, the latency
median and p99, the API's CPU per archive (its processes' user + system time over the run,
from ``/proc``) and what it allows per core, Redis's and the load generator's CPU per archive
(the ceiling all three allow on the machine's cores), and how busy the machine's cores were
(``/proc/stat``, other users included): near 100%, the cores are the limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import h11
import redis

from bench.common import (
    Row,
    api_pids,
    api_server,
    configure,
    cpu_seconds,
    machine_busy,
    ms,
    pct,
    seed_busy,
)

CLIENTS = 32
BODY = json.dumps({"stopActivity": True}).encode()


async def _client(host: str, port: int, mine: list[str], lat: list[float]) -> list[str]:
    """Archive ``mine`` one after another on one keep-alive connection; the failures."""
    reader, writer = await asyncio.open_connection(host, port)
    conn = h11.Connection(h11.CLIENT)
    errors: list[str] = []
    headers = [("Host", host), ("Content-Type", "application/json")]
    try:
        for sid in mine:
            t0 = time.perf_counter()
            request = h11.Request(
                method="POST",
                target=f"/sessions/{sid}/archive",
                headers=[*headers, ("Content-Length", str(len(BODY)))],
            )
            writer.write(conn.send(request) + conn.send(h11.Data(data=BODY)))
            writer.write(conn.send(h11.EndOfMessage()))
            status, body = await _answer(conn, reader)
            lat.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(body[:200].decode(errors="replace"))
            conn.start_next_cycle()
    finally:
        writer.close()
    return errors


async def _answer(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status, chunks = 0, []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return status, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("the API closed the connection")


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


def _measure(url: str, prefix: str, store: Any, n: int, workers: int) -> dict[str, Any]:
    ids = seed_busy(store, n)
    warm = seed_busy(store, 4 * workers)
    raw = redis.Redis.from_url(url)
    with api_server(url, prefix, workers=workers) as base:
        _run(base, warm)  # every process connected and its scripts loaded
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


def bench_concurrency(url: str, prefix: str, n: int) -> list[Row]:
    store, _ = configure(url, prefix)
    results = {workers: _measure(url, prefix, store, n, workers) for workers in (1, 2)}
    scale = results[2]["rate"] / results[1]["rate"]
    cores = os.cpu_count() or 1
    rows: list[Row] = []
    for workers, r in results.items():
        total = r["cpu"] + r["redis"] + r["client"]
        goal = ""
        if workers == 2:
            met = r["rate"] >= 500 and r["p99"] <= 0.02 and scale >= 1.6
            goal = f"; {scale:.2f}x one process; goal >= 500/s, p99 <= 20 ms, >= 1.6x: " + (
                "met" if met else "MISSED"
            )
        rows.append(
            (
                f"8 archive with stop, {CLIENTS} clients (one asyncio loop, keep-alive "
                f"HTTP/1.1), {workers} API process" + ("es" if workers > 1 else ""),
                f"n={n}",
                f"{r['rate']:.0f} archives/s, median {ms(r['median'])}, p99 {ms(r['p99'])}; "
                f"API CPU {ms(r['cpu'])} per archive ({1 / r['cpu']:.0f}/s per core)",
                f"machine {r['busy']:.0f}% busy ({cores} cores); CPU per archive: API "
                f"{ms(r['cpu'])} + Redis {ms(r['redis'])} + client {ms(r['client'])} = "
                f"{ms(total)}, a ceiling of {cores / total:.0f}/s on {cores} cores" + goal,
            )
        )
    return rows
