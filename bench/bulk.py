"""Benchmark 3: bulk archive over HTTP versus the same sessions archived one request at a time.

Both sides get the same population: idle sessions plus busy ones (stored live work in all four
families, as in benchmark 1), each side in its own cwd. Broker messages are counted as the
growth of the Celery queues in Redis (no workers consume them during the run).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from bench.common import Row, api_server, configure, fsync_relaxed, seed_busy_many

#: The full run times one request per session on every SAMPLE_EVERY-th session.
SAMPLE_EVERY = 10


def _seed_idle(store: Any, cwd: str, count: int, batch: int = 1000) -> None:
    from orchestrator.session.sessions import cwd_hash
    from orchestrator.storage.store import iso, new_id, now_ms

    create = store.script("create_session")
    for start in range(0, count, batch):
        pipe = store.redis.pipeline(transaction=False)
        for _ in range(min(batch, count - start)):
            ms = now_ms()
            create(
                keys=[],
                args=[store.keys.prefix, new_id("sess"), cwd, cwd_hash(cwd), "", ms, iso(ms)],
                client=pipe,
            )
        pipe.execute()


def _queued(store: Any) -> int:
    total = 0
    for key in store.redis.scan_iter(match=f"{store.keys.prefix}celery:*", count=1000):
        if store.redis.type(key) == "list":
            total += int(store.redis.llen(key))
    return total


def bench_bulk(url: str, prefix: str, *, quick: bool) -> list[Row]:
    idle, busy = (1_000, 100) if quick else (10_000, 1_000)
    store, _ = configure(url, prefix)
    with api_server(url, prefix) as base:
        with fsync_relaxed(url):  # seeding only; both sides are measured at `always`
            for cwd in ("/bench/bulk", "/bench/single"):
                _seed_idle(store, cwd, idle)
            seed_busy_many(store, busy, "/bench/bulk")
            single_busy = seed_busy_many(store, busy, "/bench/single")
        with httpx.Client(base_url=base, timeout=120) as client:
            before = _queued(store)
            t0 = time.perf_counter()
            r = client.post(
                "/sessions/archive", json={"filter": {"cwd": "/bench/bulk"}, "stopActivity": True}
            )
            bulk_s = time.perf_counter() - t0
            assert r.status_code == 200, r.text
            totals = r.json()["totals"]
            bulk_msgs = _queued(store) - before

            ids = [s.session_id for s in _all(store, "/bench/single")]
            assert set(single_busy) <= set(ids)
            # One request per session, timed on an even sample of a tenth of them (as many
            # busy as idle in proportion) and scaled to all: the full loop would take minutes.
            sample = ids[:: SAMPLE_EVERY if not quick else 1]
            before = _queued(store)
            t0 = time.perf_counter()
            for sid in sample:
                rr = client.post(f"/sessions/{sid}/archive", json={"stopActivity": True})
                assert rr.status_code == 200, rr.text
            scale = len(ids) / len(sample)
            single_s = (time.perf_counter() - t0) * scale
            single_msgs = round((_queued(store) - before) * scale)
    n = idle + busy
    speedup = single_s / bulk_s
    return [
        (
            f"3 bulk archive, {idle:,} idle + {busy:,} busy (one request)",
            f"n={n:,}",
            f"{bulk_s:.2f} s, {bulk_msgs} broker messages; archived {totals.get('archived')}",
            "goal <= 2 s: " + ("met" if bulk_s <= 2 else "MISSED"),
        ),
        (
            "3 same, one request per session"
            + ("" if quick else f" (timed on every {SAMPLE_EVERY}th, scaled)"),
            f"n={len(ids):,}",
            f"{single_s:.2f} s, {single_msgs} broker messages",
            f"bulk {speedup:.0f}x faster; goal >= 20x: " + ("met" if speedup >= 20 else "MISSED"),
        ),
    ]


def _all(store: Any, cwd: str) -> list[Any]:
    from orchestrator.session import sessions

    out, cursor = [], None
    while True:
        page = sessions.list_sessions(store, cwd=cwd, cursor=cursor, limit=200)
        out.extend(page.sessions)
        if page.next_cursor is None:
            return [s for s in out if s.parent_id is None]
        cursor = page.next_cursor
