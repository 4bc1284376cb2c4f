"""agent-fleet benchmarks: one command, one table, every figure measured in the same run.

    python -m bench.run            # full sizes (about 3-5 minutes on 2 cores)
    python -m bench.run --quick    # smaller sizes, for a smoke run

Each benchmark starts from a private Redis (the embedded server: append-only, fsync on every
write, as ``fleet up`` runs it) unless ``--redis-url`` is given, in which case a fresh key prefix
is used and removed afterwards. Figures are wall-clock medians and 99th percentiles from
``time.perf_counter``; floors are measured in the same run against the same server.

1. archive over HTTP (stopActivity, live work in all four families) vs two raw round trips
2. the gate at lineage depth 1, 10, 100 vs one SISMEMBER
3. bulk archive (when the bulk operation exists; see ``bench/bulk.py``)
4. archive response -> empty census, 50 busy sessions on real workers
5. (session/list pages: now part of 9)
6. step throughput through the gate vs the same workers running ungated no-op tasks
7. the naive Celery way (a flag and ``revoke(terminate=True)``) beside agent-fleet
8. archive throughput, 32 concurrent clients, one API process vs two; paced (open-loop)
   rates and the rate sustained at p99 <= 20 ms
9. a large fleet: list pages, memory per idle session, one bulk archive (``--million``)
10. a model step through the fleet vs the same request straight through the SDK
    (``bench/model.py``)
11. a shell tool call as a turn worker runs it vs the bare command (``bench/shell.py``)
12. creating a subagent under a parent of 10, 1,000 and 12,000 children vs a walk of every
    child on each create (``bench/children.py``)
13. Redis commands per one-step turn, the idle fleet's commands per second, and a one-step
    turn through the fleet vs its Redis work done directly, at ``appendfsync always`` and
    ``everysec`` (``bench/step_cost.py``; always on a private server of its own)
14. an external ACP agent's prompt through the fleet vs the same agent driven directly, and
    archive -> the agent's command gone (``bench/agents.py``)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis

from bench.agents import bench_agents
from bench.bulk import bench_bulk
from bench.children import bench_children
from bench.common import (
    Row,
    api_pids,
    api_server,
    configure,
    cpu_reference,
    cpu_seconds,
    environment,
    fsync_relaxed,
    ms,
    pct,
    seed_busy,
    timed,
    until,
)
from bench.concurrency import bench_concurrency
from bench.million import bench_million
from bench.model import bench_model_step
from bench.naive import bench_naive
from bench.shell import bench_shell
from bench.step_cost import bench_step_cost


# --------------------------------------------------------------------------- 1
def bench_archive_http(url: str, prefix: str, n: int) -> list[Row]:
    """Archives alternate between two clients on the same server, each on its own keep-alive
    connection: a lean one (the standard library's ``http.client``: what the API costs) and
    ``httpx`` (a full-featured client: what a typical Python caller sees)."""
    store, _ = configure(url, prefix)
    with api_server(url, prefix) as base:
        with fsync_relaxed(url):  # seeding only; the archives are measured at `always`
            ids = seed_busy(store, 2 * n)
            warm = seed_busy(store, 2)
        address = urlsplit(base)
        lean = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port)
        body = json.dumps({"stopActivity": True})
        headers = {"Content-Type": "application/json"}

        def by_lean(sid: str) -> tuple[int, Any]:
            lean.request("POST", f"/sessions/{sid}/archive", body, headers)
            answer = lean.getresponse()
            return answer.status, json.loads(answer.read())

        with httpx.Client(base_url=base) as client:

            def by_httpx(sid: str) -> tuple[int, Any]:
                r = client.post(f"/sessions/{sid}/archive", json={"stopActivity": True})
                return r.status_code, r.json()

            by_lean(warm[0]), by_httpx(warm[1])  # warm-up: connected, scripts loaded
            reference = cpu_reference()
            lat: dict[str, list[float]] = {"lean": [], "httpx": []}
            cpu0 = cpu_seconds(api_pids[-1])
            for i, sid in enumerate(ids):
                name, call = ("lean", by_lean) if i % 2 == 0 else ("httpx", by_httpx)
                t0 = time.perf_counter()
                status, answer = call(sid)
                lat[name].append(time.perf_counter() - t0)
                assert status == 200 and len(answer["stopDispatch"]["sent"]) == 4, answer
            cpu = (cpu_seconds(api_pids[-1]) - cpu0) / len(ids)
        lean.close()
        raw = redis.Redis.from_url(url)
        floor = timed(lambda: (raw.ping(), raw.ping()), n)
        key = f"{prefix}bench:floor"
        # The archive's path holds two writes (its script, the stop messages), each fsynced by
        # the append-only store before it answers: that is its floor on this disk.
        writes = timed(lambda: (raw.set(key, "1"), raw.set(key, "2")), n)
    med, p99 = statistics.median(lat["lean"]), pct(lat["lean"], 0.99)
    hmed, hp99 = statistics.median(lat["httpx"]), pct(lat["httpx"], 0.99)
    return [
        (
            "1 archive over HTTP, stopActivity, 4 families (keep-alive http.client; httpx "
            "beside it, alternating)",
            f"n={n} each",
            f"median {ms(med)}, p99 {ms(p99)} (httpx: median {ms(hmed)}, p99 {ms(hp99)}); "
            f"API CPU {ms(cpu)} per archive; CPU reference {ms(reference)} just before",
            f"floor 2 RTT median {ms(statistics.median(floor))}, 2 fsynced writes median "
            f"{ms(statistics.median(writes))}; goal median <= 3 ms, p99 <= 5 ms: "
            + ("met" if med <= 0.003 and p99 <= 0.005 else "MISSED"),
        ),
    ]


# --------------------------------------------------------------------------- 2
def bench_gate(url: str, prefix: str, n: int) -> list[Row]:
    from orchestrator.session import gate, sessions

    store, _ = configure(url, prefix, max_subagent_depth=128)  # a lineage 100 deep
    chain = [sessions.create_session(store, "/bench/gate").session_id]
    for _ in range(100):
        chain.append(sessions.create_session(store, "/bench/gate", parent_id=chain[-1]).session_id)
    raw = redis.Redis.from_url(url, decode_responses=True)
    floor = statistics.median(timed(lambda: raw.sismember(store.keys.archived, chain[0]), n))
    rows = [("2 gate: one SISMEMBER round trip", f"n={n}", f"median {ms(floor)}", "floor")]
    for depth in (1, 10, 100):
        sid = chain[depth]
        gate.admit(store, sid)
        med = statistics.median(timed(lambda sid=sid: gate.admit(store, sid), n))
        rows.append(
            (
                f"2 gate at lineage depth {depth}",
                f"n={n}",
                f"median {ms(med)}",
                f"{med / floor:.2f}x SISMEMBER; goal <= 1.5x: "
                + ("met" if med <= 1.5 * floor else "MISSED"),
            )
        )
    return rows


# --------------------------------------------------------------------------- 4
BUSY_PROMPT = "spawn think 60|say done\nrun 60\nremind 60 say later\nthink 60"


def bench_drain(url: str, prefix: str, n: int) -> list[Row]:
    from bench.hops import StopEvents, breakdown
    from localfleet.fleet import LocalFleet
    from orchestrator.archiving import archive
    from orchestrator.census import activity
    from orchestrator.families import Family
    from orchestrator.session import sessions
    from orchestrator.turn import turns

    store, dispatcher = configure(url, prefix)
    state = Path(tempfile.mkdtemp(prefix="fleet-bench-workers-"))
    fleet = LocalFleet(url, prefix, state, hostname="bench", concurrency=max(32, 3 * n))
    fleet.start()
    events = StopEvents(dispatcher.app)
    try:
        fleet.wait_ready(90)
        ids = [sessions.create_session(store, "/bench/drain").session_id for _ in range(n)]
        for sid in ids:
            turns.start_turn(store, dispatcher, sid, BUSY_PROMPT)
        until(
            lambda: all({i.family for i in activity.census(store, s)} == set(Family) for s in ids),
            120,
        )
        before = {sid: activity.census(store, sid) for sid in ids}
        events.start()
        answered: dict[str, float] = {}
        wall: dict[str, float] = {}
        quiet: dict[str, float] = {}
        # The census is watched from the first archive on (a thread), not after the last one,
        # so an early session's quiet is seen when it happens.
        watcher = threading.Thread(target=_watch_quiet, args=(store, ids, answered, quiet))
        watcher.start()
        for sid in ids:
            archive.archive(store, dispatcher, sid, stop_activity=True)
            answered[sid] = time.perf_counter()
            wall[sid] = time.time()
        watcher.join(65)
        time.sleep(0.5)  # the last stop tasks' events
        hops = breakdown(store, events, wall, before)
    finally:
        events.stop()
        fleet.stop()
    if len(quiet) < n:
        return [
            (
                "4 archive -> empty census",
                f"n={n}",
                f"{n - len(quiet)} never went quiet",
                "goal p99 <= 300 ms: MISSED",
            )
        ]
    waits = [quiet[s] - answered[s] for s in ids]
    p99 = pct(waits, 0.99)
    return [
        (
            "4 archive response -> empty census (real workers)",
            f"n={n}",
            f"median {ms(statistics.median(waits))}, p99 {ms(p99)}",
            "goal p99 <= 300 ms: " + ("met" if p99 <= 0.3 else "MISSED"),
        ),
        *hops,
    ]


def _watch_quiet(
    store: Any, ids: list[str], answered: dict[str, float], quiet: dict[str, float]
) -> None:
    """Until every archived session of ``ids`` has an empty census (or 60 s): one census of
    every archived, not yet quiet session per sweep (a few round trips in all)."""
    from orchestrator.census import activity

    deadline = time.monotonic() + 60
    while len(quiet) < len(ids) and time.monotonic() < deadline:
        pending = [sid for sid in ids if sid in answered and sid not in quiet]
        for sid, items in activity.census_many(store, pending).items():
            if not items:
                quiet[sid] = time.perf_counter()
        time.sleep(0.002)


# --------------------------------------------------------------------------- 6
def bench_throughput(url: str, prefix: str, n: int) -> list[Row]:
    from localfleet.fleet import LocalFleet
    from orchestrator.families import Family
    from orchestrator.session import sessions

    store, dispatcher = configure(url, prefix)
    state = Path(tempfile.mkdtemp(prefix="fleet-bench-tp-"))
    fleet = LocalFleet(url, prefix, state, hostname="benchtp", concurrency=8)
    fleet.start([Family.TURN])
    try:
        fleet.wait_ready(90)
        sid = sessions.create_session(store, "/bench/tp").session_id
        rates = {}
        for label, gated in (("ungated", False), ("gated", True)):
            counter = f"tp-{label}"
            t0 = time.perf_counter()
            for _ in range(n):
                dispatcher.send("ops.ping", [sid, counter, gated], "turn")
            key = store.keys.ops_counter(counter)
            until(lambda key=key: int(store.redis.get(key) or 0) >= n, 300)
            rates[label] = n / (time.perf_counter() - t0)
    finally:
        fleet.stop()
    ratio = rates["gated"] / rates["ungated"]
    return [
        (
            "6 no-op tasks, ungated (same turn workers)",
            f"n={n}",
            f"{rates['ungated']:.0f} tasks/s",
            "baseline",
        ),
        (
            "6 no-op tasks through the gate",
            f"n={n}",
            f"{rates['gated']:.0f} tasks/s",
            f"{ratio:.2f} of ungated; goal >= 0.8: " + ("met" if ratio >= 0.8 else "MISSED"),
        ),
    ]


def redis_label(url: str | None) -> str:
    """The Redis the figures were measured on: the server at ``url``, else the binary the
    private servers run (``redis-server`` on ``PATH`` first, as ``localfleet/embedded.py``
    picks)."""
    if url:
        with redis.Redis.from_url(url) as client:
            version, allocator = client.info("server")["redis_version"], client.info("memory")
        return f"Redis {version} ({allocator.get('mem_allocator', '?')}) at {url}"
    from localfleet.redis_binary import find_redis_server

    binary = find_redis_server()
    if binary is None:
        return "no redis-server"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
    return f"Redis {fields.get('v', '?')} ({fields.get('malloc', '?')}) from {binary}"


def _machine_row(before: float, after: float) -> Row:
    """Row 0: how fast this machine ran Python at the start and the end of the run
    (``cpu_reference``), so figures from runs at different speeds can be told apart."""
    return (
        "0 this machine's speed: a fixed CPU-only workload (JSON round trips, no I/O)",
        "median of 9",
        f"{ms(before)} before the run, {ms(after)} after",
        "lower is faster; compare it between runs before comparing their figures",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--redis-url", default=None, help="use this Redis (fresh prefix)")
    parser.add_argument("--only", default="", help="comma list of benchmark numbers to run")
    parser.add_argument(
        "--million",
        action="store_true",
        help="benchmark 9 at 1,000,000 sessions (100,000 idle + 10,000 busy archived)",
    )
    args = parser.parse_args()
    q = args.quick
    only = {int(x) for x in args.only.split(",") if x}
    # (sessions, idle, busy) of benchmark 9; --million for its full sizes.
    million = (
        (1_000_000, 100_000, 10_000)
        if args.million
        else (20_000, 2_000, 200)
        if q
        else (100_000, 10_000, 1_000)
    )
    plan: list[tuple[int, Callable[[str, str], list[Row]]]] = [
        (1, lambda u, p: bench_archive_http(u, p, 200 if q else 800)),
        (2, lambda u, p: bench_gate(u, p, 500 if q else 2000)),
        (4, lambda u, p: bench_drain(u, p, 10 if q else 50)),
        (6, lambda u, p: bench_throughput(u, p, 500 if q else 1500)),
        (7, lambda u, p: bench_naive(u, p, 10 if q else 50)),
        (8, lambda u, p: bench_concurrency(u, p, 200 if q else 1000, quick=q)),
        (9, lambda u, p: bench_million(u, p, *million)),
        (10, lambda u, p: bench_model_step(u, p, 50 if q else 300)),
        (11, lambda u, p: bench_shell(u, p, 20 if q else 60)),
        (12, lambda u, p: bench_children(u, p, 50 if q else 200)),
        (13, lambda u, p: bench_step_cost(20 if q else 100)),
        (14, lambda u, p: bench_agents(u, p, 5 if q else 20)),
    ]
    plan.insert(2, (3, lambda u, p: bench_bulk(u, p, quick=q)))
    rows: list[Row] = []
    errors = 0
    reference = cpu_reference()
    for number, fn in plan:
        if only and number not in only:
            continue
        started = time.perf_counter()
        try:
            with environment(args.redis_url) as (url, prefix):
                rows.extend(fn(url, prefix))
        except Exception as exc:  # one row says what broke; the others still run
            errors += 1
            rows.append((f"{number} ERROR", "", f"{type(exc).__name__}: {exc}"[:300], ""))
        print(f"benchmark {number} done in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    rows.insert(0, _machine_row(reference, cpu_reference()))
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "benchmark",
        "size",
        "result",
        "compared with / goal",
        title=f"agent-fleet benchmarks: {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {redis_label(args.redis_url)}",
    )
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)
    # A missed goal is a figure, not a failure: only a benchmark that could not run fails.
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
