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

Each side is watched from its first archive on, every ``POLL`` s, as benchmark 4 watches its
census, so a session's quiet is seen when it happens and not after the rest of the archive
loop. agent-fleet's time to quiet is the ``quietAt`` it records; the time this watch first
saw its census empty is printed beside it (benchmark 4's own measure). Its model steps are
counted from each session's archive answer on. Printed too, for agent-fleet: the load
before the archives (the store's round trip, the steps waiting for the turn worker: these
sessions step every second, benchmark 4's do not) and the breakdown by family and hop of
``bench/hops.py`` for the same sessions.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import threading
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
#: How often the watch sweeps the archived sessions (seconds).
POLL = 0.005


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
    from orchestrator.census import activity
    from orchestrator.families import Family
    from orchestrator.session import sessions
    from orchestrator.turn import turns

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
    from orchestrator.census import activity

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


def _fired(store: Any, reminder_ids: list[str]) -> set[str]:
    """Those of ``reminder_ids`` that fired (their turn was created)."""
    pipe = store.redis.pipeline(transaction=False)
    for r in reminder_ids:
        pipe.hget(store.keys.reminder(r), "state")
    return {r for r, state in zip(reminder_ids, pipe.execute(), strict=True) if state == "fired"}


def _first_arg(task: dict[str, Any]) -> str | None:
    args = task.get("args")
    if isinstance(args, list | tuple) and args:
        return str(args[0])
    return None


class _Watch:
    """Watches archived sessions from the first archive on (a thread), so a session's quiet is
    seen when it happens, not after the rest of the archive loop: until ``WINDOW`` seconds
    after the last archive, every ``POLL`` s, per session the model requests of its lineage,
    its job processes and (agent-fleet) its census. ``at``: wall-clock answers, filled by the
    archiving thread as it goes; ``done`` is set once the last archive answered."""

    def __init__(
        self, store: Any, side: str, seeded: dict[str, dict[str, Any]], before: dict[str, int]
    ) -> None:
        self.store, self.side, self.seeded = store, side, seeded
        self.at: dict[str, float] = {}
        self.done = threading.Event()
        #: When each went quiet: agent-fleet's own ``quietAt``; naive: its last model request
        #: once no job process is left.
        self.quiet: dict[str, float] = {}
        #: agent-fleet: when this watch first saw the census empty and no job process left.
        self.seen_empty: dict[str, float] = {}
        #: agent-fleet: sessions whose census was empty with no ``quietAt`` recorded.
        self.unrecorded: set[str] = set()
        #: Model requests of each lineage as last seen, from its count when it was archived.
        self.before = dict(before)
        self.seen = dict(before)
        #: Reminders that fired before their session's archive (due during the set-up).
        self.fired_before: set[str] = set()
        self.last_step: dict[str, float] = {}
        self.pids_at_5s: int | None = None
        self.lineages = {sid: _lineage(store, sid) for sid in seeded}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> _Watch:
        self._thread.start()
        return self

    def _sweep(self, now: float) -> None:
        archived = [sid for sid in self.seeded if sid in self.at]
        pipe = self.store.redis.pipeline(transaction=False)
        for sid in archived:
            for s in self.lineages[sid]:
                pipe.llen(self.store.keys.model_requests(s))
        counts = iter(pipe.execute())
        for sid in archived:
            count = sum(int(next(counts)) for _ in self.lineages[sid])
            self.last_step.setdefault(sid, self.at[sid])
            if count != self.seen[sid]:
                self.seen[sid], self.last_step[sid] = count, now
                self.quiet.pop(sid, None)
        pending = [
            sid
            for sid in archived
            if sid not in self.quiet and not any(_alive(p) for p in self.seeded[sid]["pids"])
        ]
        if self.side == "agent-fleet":
            self._census(pending, now)
        else:
            for sid in pending:
                self.quiet[sid] = max(now, self.last_step[sid])

    def _census(self, pending: list[str], now: float) -> None:
        from orchestrator.census import activity

        for sid, items in activity.census_many(self.store, pending).items():
            if items:
                continue
            self.seen_empty.setdefault(sid, now)
            recorded = self.store.redis.hget(self.store.keys.session(sid), "quietAt")
            if recorded:
                self.quiet[sid] = datetime.fromisoformat(recorded).timestamp()
            else:
                self.unrecorded.add(sid)

    def _run(self) -> None:
        while not self.done.is_set() or time.time() < max(self.at.values()) + WINDOW:
            now = time.time()
            if self.at:
                self._sweep(now)
            if self.pids_at_5s is None and self.at and now >= min(self.at.values()) + 5:
                self.pids_at_5s = sum(
                    _alive(p) for info in self.seeded.values() for p in info["pids"]
                )
            time.sleep(POLL)

    def archived(self, sid: str, answered: float) -> None:
        """``sid``'s archive answered at ``answered`` (wall clock): its lineage's model
        requests are counted now, so any counted later began after the answer."""
        count = _requests(self.store, self.lineages[sid])
        self.before[sid] = self.seen[sid] = count
        self.fired_before |= _fired(self.store, self.seeded[sid]["reminders"])
        self.at[sid] = answered

    def result(self) -> dict[str, Any]:
        """Once the window is over: the figures of this side (and its processes killed)."""
        self._thread.join()
        store, seeded = self.store, self.seeded
        every = [r for info in seeded.values() for r in info["reminders"]]
        fired = len(_fired(store, every) - self.fired_before)
        for info in seeded.values():  # leave nothing running for the next side
            for pid in info["pids"]:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
        waits = [self.quiet[s] - self.at[s] for s in self.quiet]
        empty = [self.seen_empty[s] - self.at[s] for s in self.seen_empty]
        return {
            "quiet": len(self.quiet),
            "median": statistics.median(waits) if waits else None,
            "p99": pct(waits, 0.99) if waits else None,
            "empty": (statistics.median(empty), pct(empty, 0.99)) if empty else None,
            "unrecorded": len(self.unrecorded - set(self.quiet)),
            "steps": sum(self.seen[s] - self.before[s] for s in seeded),
            "pids": self.pids_at_5s or 0,
            "fired": fired,
            "jobs": sum(len(i["pids"]) for i in seeded.values()),
            "reminders": len(every) - len(self.fired_before),
        }


def _offline(fleet: Any, store: Any, dispatcher: Any, k: int) -> dict[str, int]:
    """With the turn worker offline, ``k`` sessions per side get a turn (its steps wait in the
    queue) and are archived; then the worker starts. Model steps that ran anyway, per side."""
    from orchestrator.archiving import archive
    from orchestrator.families import Family
    from orchestrator.session import sessions
    from orchestrator.turn import turns

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


def _archive_side(
    store: Any, dispatcher: Any, side: str, seeded: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], list[Row]]:
    """Archive ``seeded`` the ``side`` way under a watch; its figures, and for agent-fleet the
    breakdown by family and hop (``bench/hops.py``) of the same sessions."""
    from bench.hops import StopEvents, breakdown, load_probe
    from orchestrator.archiving import archive
    from orchestrator.census import activity

    sids = list(seeded)
    fleet_side = side == "agent-fleet"
    items = {sid: activity.census(store, sid) for sid in sids} if fleet_side else {}
    ping, waiting = load_probe(store, 0.3)
    before = {s: _requests(store, _lineage(store, s)) for s in sids}
    events = StopEvents(dispatcher.app).start() if fleet_side else None
    watch = _Watch(store, side, seeded, before).start()
    try:
        if fleet_side:
            for sid in sids:
                archive.archive(store, dispatcher, sid, stop_activity=True)
                watch.archived(sid, time.time())
        else:
            watch.fired_before = _fired(store, [r for i in seeded.values() for r in i["reminders"]])
            _naive_archive(dispatcher.app, store, sids)
            watch.at.update(dict.fromkeys(sids, time.time()))
        watch.done.set()
        result = watch.result()
    finally:
        watch.done.set()
        if events is not None:
            events.stop()
    hops = breakdown(store, events, watch.at, items, label="7") if events is not None else []
    load = (
        f"7 {side}: load before the archives",
        f"n={len(sids)}",
        f"Redis PING median {ms(ping)}; up to {waiting} steps waiting in the turn queue",
        "the sessions' own steps (one a second each, and their subagents')",
    )
    return result, [load, *hops]


def bench_naive(url: str, prefix: str, n: int) -> list[Row]:
    from localfleet.fleet import LocalFleet

    store, dispatcher = configure(url, prefix)
    state = Path(tempfile.mkdtemp(prefix="fleet-bench-naive-"))
    fleet = LocalFleet(url, prefix, state, hostname="naive", concurrency=max(32, 3 * n))
    fleet.start()
    results: dict[str, dict[str, Any]] = {}
    hops: list[Row] = []
    try:
        fleet.wait_ready(90)
        for side in ("naive Celery", "agent-fleet"):
            seeded = _busy(store, dispatcher, n, f"/bench/naive/{side}")
            results[side], found = _archive_side(store, dispatcher, side, seeded)
            hops.extend(found)
        offline = _offline(fleet, store, dispatcher, 5)
    finally:
        fleet.stop()
    return [*(_row(side, r, n, offline[side]) for side, r in results.items()), *hops]


def _row(side: str, r: dict[str, Any], n: int, offline_steps: int) -> Row:
    quiet = f"quiet {r['quiet']}/{n} in {WINDOW:.0f} s" + (
        f" (median {ms(r['median'])}, p99 {ms(r['p99'])})" if r["median"] is not None else ""
    )
    if r["empty"] is not None:
        quiet += f"; census seen empty median {ms(r['empty'][0])}, p99 {ms(r['empty'][1])}"
    if r["unrecorded"]:
        quiet += f"; {r['unrecorded']} empty with no quietAt recorded"
    return (
        f"7 {side}: archive {n} busy sessions",
        f"n={n}",
        f"{quiet}; {r['steps']} model steps after; {r['pids']}/{r['jobs']} job processes alive"
        f" at 5 s; {r['fired']}/{r['reminders']} reminders fired after it",
        f"turn worker offline at archive: {offline_steps} model steps ran after (5 sessions)",
    )
