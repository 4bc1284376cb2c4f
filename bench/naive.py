"""Benchmark 7: the naive Celery way beside agent-fleet, on the same workers.

What a Celery user would write without agent-fleet: a flag in Redis saying the session is
archived, plus ``app.control.revoke(task_ids, terminate=True)`` for the session's running and
queued tasks (found with ``app.control.inspect()``), and nothing for reminders, jobs or
children. Both sides get the same busy sessions (a subagent thinking, a background job, a
reminder due soon, the turn thinking step after step) on the same fleet of workers; the naive
side's flag is read by nothing (the gate reads the archive), which is the point.

Printed side by side: time to quiet (no model step, no job process, nothing live left),
model steps recorded after the archive, job processes still alive 5 s after it, reminders
that still fired, and, with the turn worker offline at archive time and started after, the
model steps that ran anyway.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import Row, configure, ms, pct, until

#: Steps of 1 s one after the other, a subagent doing the same, a job, a reminder due in 8 s.
PROMPT = (
    "spawn think 1|think 1|think 1|think 1|say done\n"
    "run 60\nremind 8 say later\n" + "think 1\n" * 8 + "say done"
)
#: Queued while the turn worker is offline.
OFFLINE_PROMPT = "think 1\nthink 1\nthink 1\nsay done"
#: How long each side is watched after its archives.
WINDOW = 10.0


def _lineage(store: Any, sid: str) -> list[str]:
    out, level = [sid], [sid]
    while level:
        level = [c for s in level for c in store.redis.smembers(store.keys.children(s))]
        out.extend(level)
    return out


def _requests(store: Any, sids: list[str]) -> int:
    return sum(int(store.redis.llen(store.keys.model_requests(s))) for s in sids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _busy(store: Any, dispatcher: Any, n: int, cwd: str) -> dict[str, dict[str, Any]]:
    """``n`` sessions busy in all four families; per session its job pids and reminder ids."""
    from orchestrator import activity, sessions, turns
    from orchestrator.families import Family

    ids = [sessions.create_session(store, cwd).session_id for _ in range(n)]
    for sid in ids:
        turns.start_turn(store, dispatcher, sid, PROMPT)

    def ready() -> bool:
        return all(
            {i.family for i in activity.census(store, s)} == set(Family)
            and store.redis.hget(store.keys.job(_first(store, s, Family.JOB)), "pid")
            for s in ids
        )

    until(ready, 120)
    out = {}
    for sid in ids:
        items = activity.census(store, sid)
        jobs = [i.id for i in items if i.family == Family.JOB]
        out[sid] = {
            "pids": [int(store.redis.hget(store.keys.job(j), "pid")) for j in jobs],
            "reminders": [i.id for i in items if i.family == Family.REMINDER],
        }
    return out


def _first(store: Any, sid: str, family: str) -> str:
    from orchestrator import activity

    return next(i.id for i in activity.own_items(store, sid) if i.family == family)


def _naive_archive(app: Any, store: Any, sids: list[str]) -> None:
    """The naive archive of ``sids``: a flag each, then one inspection of what the workers run
    and hold, and a revoke (terminate) of every task whose first argument is the session."""
    for sid in sids:
        store.redis.set(f"{store.keys.prefix}naive:archived:{sid}", "1")
    inspect = app.control.inspect(timeout=1.0)
    tasks: list[dict[str, Any]] = []
    for reply in (inspect.active() or {}, inspect.reserved() or {}):
        for found in reply.values():
            tasks.extend(found)
    for sid in sids:
        ids = [t["id"] for t in tasks if _first_arg(t) == sid]
        if ids:
            app.control.revoke(ids, terminate=True)


def _first_arg(task: dict[str, Any]) -> str | None:
    args = task.get("args")
    if isinstance(args, list | tuple) and args:
        return str(args[0])
    return None


def _watch(
    store: Any,
    side: str,
    seeded: dict[str, dict[str, Any]],
    at: dict[str, float],
    before: dict[str, int],
) -> dict[str, Any]:
    """Watch the archived sessions until ``WINDOW`` seconds after the last archive (``at``:
    wall-clock answers): when each went quiet (its last model request, no job process left;
    for agent-fleet the ``quietAt`` it records, once its census is empty), and what ran."""
    from orchestrator import activity

    quiet: dict[str, float] = {}
    last_step: dict[str, float] = {sid: at[sid] for sid in seeded}
    lineages = {sid: _lineage(store, sid) for sid in seeded}
    seen = dict(before)
    pids_at_5s: int | None = None
    end = max(at.values()) + WINDOW
    while time.time() < end:
        now = time.time()
        pipe = store.redis.pipeline(transaction=False)
        for sid in seeded:
            for s in lineages[sid]:
                pipe.llen(store.keys.model_requests(s))
        counts = iter(pipe.execute())
        for sid in seeded:
            count = sum(int(next(counts)) for _ in lineages[sid])
            if count != seen[sid]:
                seen[sid], last_step[sid] = count, now
                quiet.pop(sid, None)
        pending = [
            sid
            for sid, info in seeded.items()
            if sid not in quiet and not any(_alive(p) for p in info["pids"])
        ]
        if side == "agent-fleet":
            for sid, items in activity.census_many(store, pending).items():
                if not items:
                    recorded = store.redis.hget(store.keys.session(sid), "quietAt")
                    quiet[sid] = datetime.fromisoformat(recorded).timestamp() if recorded else now
        else:
            for sid in pending:
                quiet[sid] = max(now, last_step[sid])
        if pids_at_5s is None and now >= min(at.values()) + 5:
            pids_at_5s = sum(_alive(p) for info in seeded.values() for p in info["pids"])
        time.sleep(0.02)
    fired = sum(
        store.redis.hget(store.keys.reminder(r), "state") == "fired"
        for info in seeded.values()
        for r in info["reminders"]
    )
    steps = sum(seen[s] - before[s] for s in seeded)
    for info in seeded.values():  # leave nothing running for the next side
        for pid in info["pids"]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    waits = [quiet[s] - at[s] for s in quiet]
    return {
        "quiet": len(quiet),
        "median": statistics.median(waits) if waits else None,
        "p99": pct(waits, 0.99) if waits else None,
        "steps": steps,
        "pids": pids_at_5s or 0,
        "fired": fired,
        "jobs": sum(len(i["pids"]) for i in seeded.values()),
        "reminders": sum(len(i["reminders"]) for i in seeded.values()),
    }


def _offline(fleet: Any, store: Any, dispatcher: Any, k: int) -> dict[str, int]:
    """With the turn worker offline, ``k`` sessions per side get a turn (its steps wait in the
    queue) and are archived; then the worker starts. Model steps that ran anyway, per side."""
    from orchestrator import archive, sessions, turns
    from orchestrator.families import Family

    turn_workers = [w for w in fleet.workers if w.family == Family.TURN]
    for w in turn_workers:
        w.process.terminate()
        w.process.wait(30)
    sides: dict[str, list[str]] = {}
    for side in ("naive Celery", "agent-fleet"):
        sids = [
            sessions.create_session(store, f"/bench/offline/{side}").session_id for _ in range(k)
        ]
        for sid in sids:
            turns.start_turn(store, dispatcher, sid, OFFLINE_PROMPT)
        if side == "agent-fleet":
            for sid in sids:
                archive.archive(store, dispatcher, sid, stop_activity=True)
        else:
            _naive_archive(dispatcher.app, store, sids)
        sides[side] = sids
    fleet.restart_dead()
    fleet.wait_ready(90)
    time.sleep(6)  # the steps are 1 s each: long enough for three
    return {side: _requests(store, sids) for side, sids in sides.items()}


def bench_naive(url: str, prefix: str, n: int) -> list[Row]:
    from api.local import LocalFleet
    from orchestrator import archive

    store, dispatcher = configure(url, prefix)
    state = Path(tempfile.mkdtemp(prefix="fleet-bench-naive-"))
    fleet = LocalFleet(url, prefix, state, hostname="naive", concurrency=max(32, 3 * n))
    fleet.start()
    results: dict[str, dict[str, Any]] = {}
    try:
        fleet.wait_ready(90)
        for side in ("naive Celery", "agent-fleet"):
            seeded = _busy(store, dispatcher, n, f"/bench/naive/{side}")
            sids = list(seeded)
            before = {s: _requests(store, _lineage(store, s)) for s in sids}
            at: dict[str, float] = {}
            if side == "agent-fleet":
                for sid in sids:
                    archive.archive(store, dispatcher, sid, stop_activity=True)
                    at[sid] = time.time()
            else:
                _naive_archive(dispatcher.app, store, sids)
                at = dict.fromkeys(sids, time.time())
            results[side] = _watch(store, side, seeded, at, before)
        offline = _offline(fleet, store, dispatcher, 5)
    finally:
        fleet.stop()
    return [_row(side, r, n, offline[side]) for side, r in results.items()]


def _row(side: str, r: dict[str, Any], n: int, offline_steps: int) -> Row:
    quiet = f"quiet {r['quiet']}/{n} in {WINDOW:.0f} s" + (
        f" (median {ms(r['median'])}, p99 {ms(r['p99'])})" if r["median"] is not None else ""
    )
    return (
        f"7 {side}: archive {n} busy sessions",
        f"n={n}",
        f"{quiet}; {r['steps']} model steps after; {r['pids']}/{r['jobs']} job processes alive"
        f" at 5 s; {r['fired']}/{r['reminders']} reminders fired",
        f"turn worker offline at archive: {offline_steps} model steps ran after (5 sessions)",
    )
