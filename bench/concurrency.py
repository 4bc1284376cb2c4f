"""Benchmark 8: archive throughput under concurrency, one API process against two.

32 clients (threads, one HTTP connection each) archive busy sessions with ``stopActivity`` as
fast as they are answered, against one API process and then against two behind the same
socket (``uvicorn --workers 2``), each run on sessions seeded for it. Reported: archives a
second, the latency median and p99, and the API's CPU seconds per archive (its processes'
user + system time over the run, from ``/proc``).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import httpx

from bench.common import Row, api_pids, api_server, configure, cpu_seconds, ms, pct, seed_busy

CLIENTS = 32


def _run(base: str, ids: list[str]) -> tuple[float, list[float]]:
    """Archive ``ids`` from ``CLIENTS`` threads; (wall seconds, latencies)."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    chunks = [ids[i::CLIENTS] for i in range(CLIENTS)]

    def client(mine: list[str]) -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            for sid in mine:
                t0 = time.perf_counter()
                r = http.post(f"/sessions/{sid}/archive", json={"stopActivity": True})
                took = time.perf_counter() - t0
                with lock:
                    lat.append(took)
                    if r.status_code != 200:
                        errors.append(r.text[:200])

    threads = [threading.Thread(target=client, args=(c,)) for c in chunks]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} archives failed, first: {errors[0]}")
    return wall, lat


def bench_concurrency(url: str, prefix: str, n: int) -> list[Row]:
    store, _ = configure(url, prefix)
    results: dict[int, dict[str, Any]] = {}
    for workers in (1, 2):
        ids = seed_busy(store, n)
        warm = seed_busy(store, 4 * workers)
        with api_server(url, prefix, workers=workers) as base:
            _run(base, warm)  # every process connected and its scripts loaded
            pid = api_pids[-1]
            cpu0 = cpu_seconds(pid)
            wall, lat = _run(base, ids)
            cpu = cpu_seconds(pid) - cpu0
        results[workers] = {
            "rate": n / wall,
            "median": statistics.median(lat),
            "p99": pct(lat, 0.99),
            "cpu": cpu / n,
        }
    one, two = results[1], results[2]
    scale = two["rate"] / one["rate"]
    cores = os.cpu_count() or 1
    rows: list[Row] = []
    for workers, r in results.items():
        rows.append(
            (
                f"8 archive with stop, {CLIENTS} clients, {workers} API process"
                + ("es" if workers > 1 else ""),
                f"n={n}",
                f"{r['rate']:.0f} archives/s, median {ms(r['median'])}, p99 {ms(r['p99'])}; "
                f"API CPU {ms(r['cpu'])} per archive",
                (
                    f"{scale:.2f}x one process; goal >= 500/s, p99 <= 20 ms, >= 1.6x: "
                    + (
                        "met"
                        if r["rate"] >= 500 and r["p99"] <= 0.02 and scale >= 1.6
                        else "MISSED"
                    )
                    if workers == 2
                    else f"CPU-bound ceiling {1 / r['cpu']:.0f}/s per core ({cores} cores)"
                ),
            )
        )
    return rows
