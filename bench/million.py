"""Benchmark 9: a large fleet. ``size`` sessions seeded through the product's own scripts,
pipelined (half archived, a tenth subagents of another session), then:

- ``session/list`` page latency per filter at ``size`` against the same at 10,000 (the first
  10,000 seeded, measured before the rest is added);
- Redis memory per idle session (``used_memory`` growth over ``idle`` idle sessions added in
  ten steps, less the steps in which a server hash table resized: ``bench/memory.py``);
- one bulk archive by filter of ``idle`` idle + ``busy`` busy sessions (stored live work in all
  four families) over HTTP, with the API process's memory growth (peak RSS, ``/proc``).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    Row,
    api_pids,
    api_server,
    configure,
    embedded_urls,
    ms,
    pct,
    seed_busy_many,
    timed,
    until,
)
from bench.memory import Probe, measure

SMALL = 10_000


def seed(store: Any, count: int, cwd: str, *, archive_half: bool, batch: int = 2000) -> None:
    """``count`` sessions in ``cwd``, pipelined ``batch`` at a time: one session in ten a
    subagent of the session before it; with ``archive_half`` every second one archived."""
    from orchestrator.archiving.archive import ArchiveRun
    from orchestrator.session.sessions import cwd_hash
    from orchestrator.storage.store import iso, new_id, now_ms

    create = store.script("create_session")
    arc = store.script("archive")
    # What a single archive's script is given (archive.archive), without a dispatcher: an
    # archive without stopActivity sends nothing.
    recorder = ArchiveRun(
        store, None, stop=False, dry=False, describe_refused=True, action="archive", single=True
    ).in_script_record()
    h = cwd_hash(cwd)
    made = 0
    while made < count:
        pipe = store.redis.pipeline(transaction=False)
        ids: list[str] = []
        for i in range(min(batch, count - made)):
            sid = new_id("sess")
            parent = ids[-1] if i % 10 == 9 else ""
            stamp = now_ms()
            create(
                keys=[],
                args=[store.keys.prefix, sid, cwd, h, parent, stamp, iso(stamp), "", "", 99, 99],
                client=pipe,
            )
            ids.append(sid)
        if archive_half:
            for sid in ids[::2]:
                arc(
                    keys=[],
                    args=[store.keys.prefix, "0", "0", "", new_id("arc"), "", "0", recorder]
                    + ["", sid],
                    client=pipe,
                )
        pipe.execute()
        made += len(ids)


def _pages(store: Any, n: int) -> dict[str, list[float]]:
    from orchestrator.session import sessions

    out = {}
    for flt in ("exclude", "include", "only"):
        cursor = sessions.list_sessions(store, archived=flt).next_cursor
        lat = timed(lambda flt=flt: sessions.list_sessions(store, archived=flt), n // 2)
        lat += timed(
            lambda flt=flt, c=cursor: sessions.list_sessions(store, archived=flt, cursor=c),
            n // 2,
        )
        out[flt] = lat
    return out


def _rss_peak_mb(pid: int) -> float:
    """The peak resident set (VmHWM) of ``pid``, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _script_seconds(store: Any) -> float:
    """Seconds the Redis server spent in scripts (``EVAL``/``EVALSHA``, the commands they
    call included) since the last ``CONFIG RESETSTAT``."""
    stats = store.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval")) / 1e6


def _memory(store: Any, idle: int) -> Row:
    """The memory row: ``idle`` idle sessions added in ten steps (``bench/memory.py``)."""
    from orchestrator.session.sessions import cwd_hash

    h = cwd_hash("/bench/bulk")
    zsets = [store.keys.index(state, c) for state in ("all", "active") for c in (None, h)]
    probe = Probe(store.redis, zsets, strip=store.keys.prefix)
    fig, steps, _ = measure(
        probe, lambda n: seed(store, n, "/bench/bulk", archive_half=False), idle
    )
    resized: dict[str, list[int]] = {}
    for i, step in enumerate(steps, 1):
        for name in step.resized:
            resized.setdefault(name.replace(h, "<cwd>"), []).append(i)
    forked = [i for i, step in enumerate(steps, 1) if step.forked]
    return (
        "9 Redis memory per idle session",
        f"n={idle:,} in {len(steps)} steps",
        f"{fig.per_session:.0f} bytes ({fig.steady:.0f} median of"
        f" {len(steps) - len(fig.left_out)} quiet steps + {fig.buckets:.0f} table buckets);"
        f" whole span {fig.span:.0f} bytes",
        "goal <= 1 KiB: "
        + ("met" if fig.per_session <= 1024 else "MISSED")
        + "; resized in the span (step): "
        + (", ".join(f"{n} ({', '.join(map(str, at))})" for n, at in resized.items()) or "none")
        + (f"; a fork child ran in step {forked} (left out)" if forked else "; no fork child"),
    )


def _key_table(before: tuple[int, int], after: tuple[int, int]) -> str:
    """What Redis's own key table did during the bulk, from ``Probe.tables`` (slots, keys)
    before and after it: a doubling inside the bulk makes every lookup of the bulk read two
    tables until its keys are moved (``docs/benchmarks.md``, "Why the million missed")."""
    (slots0, keys0), (slots1, keys1) = before, after
    said = f"Redis key table {slots0:,} -> {slots1:,} slots ({keys0:,} -> {keys1:,} keys)"
    if slots1 > slots0:
        return said + ": it grew during the bulk"
    return said + ": no resize"


def bench_million(url: str, prefix: str, size: int, idle: int, busy: int) -> list[Row]:
    store, _ = configure(url, prefix)
    rows: list[Row] = []
    t0 = time.perf_counter()
    seed(store, SMALL, "/bench/list", archive_half=True)
    small = _pages(store, 200)
    seed(store, size - SMALL, "/bench/list", archive_half=True)
    seeded = time.perf_counter() - t0
    big = _pages(store, 200)
    worst = 0.0
    for flt in ("exclude", "include", "only"):
        ratio = statistics.median(big[flt]) / statistics.median(small[flt])
        worst = max(worst, ratio)
        rows.append(
            (
                f"9 session/list page ({flt}), {size:,} vs {SMALL:,} sessions",
                "n=200 each",
                f"median {ms(statistics.median(big[flt]))} vs {ms(statistics.median(small[flt]))}"
                f", p99 {ms(pct(big[flt], 0.99))}",
                f"{ratio:.2f}x; goal <= 1.5x and median <= 5 ms: "
                + ("met" if ratio <= 1.5 and statistics.median(big[flt]) <= 0.005 else "MISSED"),
            )
        )
    rows.append(
        ("9 seeding, pipelined scripts", f"n={size:,}", f"{seeded:.1f} s", f"{size / seeded:.0f}/s")
    )

    rows.append(_memory(store, idle))
    # 1,000 per job host: a claim counts its host's live jobs.
    seed_busy_many(store, busy, "/bench/bulk", per_host=1000, threads=16)
    # An AOF rewrite the seeding set off would run beside the bulk archive, its fork child
    # making each page the scripts first touch a copy: the archive starts once none runs, and
    # the row says whether one ran during it. On a private server the archive starts right
    # after a rewrite of its own, so the file's growth during the bulk cannot set one off
    # (auto-aof-rewrite-percentage: the file twice its size after the last rewrite) in one
    # run and not in the next.
    probe = Probe(store.redis, [])
    probe.wait_no_fork()
    if url in embedded_urls:
        store.redis.bgrewriteaof()
        until(lambda: not int(store.redis.info("persistence")["aof_rewrite_scheduled"]), 60)
        probe.wait_no_fork()
    with api_server(url, prefix, extra_env={"FLEET_BULK_FILTER_MAX": str(idle + 2 * busy)}) as base:
        pid = api_pids[-1]
        with httpx.Client(base_url=base, timeout=300) as client:
            client.get("/sessions", params={"limit": 1})
            rss0 = _rss_mb(pid)
            mem0 = int(store.redis.info("memory")["used_memory"])
            forks0, _ = probe.forks()
            table0 = probe.tables()["keyspace"]
            store.redis.config_resetstat()
            t1 = time.perf_counter()
            r = client.post(
                "/sessions/archive", json={"filter": {"cwd": "/bench/bulk"}, "stopActivity": True}
            )
            took = time.perf_counter() - t1
            forks1, running = probe.forks()
            table1 = probe.tables()["keyspace"]
        assert r.status_code == 200, r.text[:300]
        growth = _rss_peak_mb(pid) - rss0
    forked = forks1 > forks0 or running
    scripts = _script_seconds(store)
    totals = r.json()["totals"]
    # What an archive adds to a session (its fields, its audit entry), the stop messages and
    # capped streams included, per session the request selected.
    per_archived = (int(store.redis.info("memory")["used_memory"]) - mem0) / totals["selected"]
    rows.append(
        (
            f"9 bulk archive by filter, {idle:,} idle + {busy:,} busy, one request",
            f"n={idle + busy:,}",
            f"{took:.2f} s, API peak memory +{growth:.0f} MB; {totals.get('selected')} selected,"
            f" {totals.get('archived')} archived, {totals.get('already_archived')} with their"
            f" parent, {totals.get('refused')} refused; Redis ran scripts {scripts:.2f} s;"
            f" Redis memory +{per_archived:.0f} bytes per session archived;"
            + (" a fork child (AOF rewrite) ran beside it" if forked else " no fork child")
            + "; "
            + _key_table(table0, table1),
            "goal <= 10 s and <= 200 MB: " + ("met" if took <= 10 and growth <= 200 else "MISSED"),
        )
    )
    return rows
