"""Where the time from an archive to quiet goes (benchmark 4's breakdown), by family and hop.

The hops of one family's stop, each timed per session from what the fleet records itself:

- delivery: the archive's response -> the worker starts the stop task (Celery's
  ``task-started`` event, which the workers send with ``-E``);
- noticing: the stop task starts -> it ends (the family's runtime has acted on it: the turn
  is cancelled or flagged for its step, the job's process signalled, the reminder deleted);
- exiting: the stop task ends -> the item's own end is recorded (``endedAt`` of the turn the
  step settles, of the job whose process exited; none for a reminder);
- recording quiet: the last item's end (a reminder's: its stop's end; a turn's: its own, not
  its ``turn.stop``'s, which may come later) -> ``quietAt`` on the session (the check a stop
  or a step makes once it acted, ``activity.note_quiet``); with which family ended last.

``ended`` is the whole of it for one item: the response -> its recorded end. Two families
may end an item before its stop task starts, which ``early`` counts: a turn's step in flight
ends on its own when its watch sees the turn no longer running (``steps._StepWatch``, woken by
the gate's closure), and a job host stops a job when it hears the closure of its session and
the gate refuses it (``JobSupervisor``, ``orchestrator/job/jobgatewatch.py``). Then the stop task
only
finds the item ended, and ``exiting`` reads 0.

Clocks: Celery's event timestamps and the stored times are this machine's wall clock (the
workers and Redis run here), and the response time is taken with ``time.time``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from bench.common import Row, ms, pct


class StopEvents:
    """Captures Celery task events of the fleet's stop tasks in a thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.tasks: dict[str, dict[str, Any]] = defaultdict(dict)
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def _on(self, event: dict[str, Any]) -> None:
        uuid = event.get("uuid")
        if not uuid:
            return
        task = self.tasks[uuid]
        kind = str(event.get("type", ""))
        task[kind] = float(event.get("timestamp", 0.0))
        for key in ("name", "args"):
            if event.get(key):
                task[key] = event[key]

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
            self._ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self) -> StopEvents:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)

    def started(self, sids: list[str]) -> dict[tuple[str, str], tuple[float, float]]:
        """``(sid, family) -> (task-started, task-succeeded)`` of each session's stop task."""
        out: dict[tuple[str, str], tuple[float, float]] = {}
        for task in self.tasks.values():
            name = str(task.get("name", ""))
            if not name.endswith(".stop") or "task-started" not in task:
                continue
            args = str(task.get("args", ""))
            sid = next((s for s in sids if s in args), None)
            if sid is not None:
                done = task.get("task-succeeded", task["task-started"])
                out[(sid, name.split(".")[0])] = (task["task-started"], done)
        return out


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def _item_ends(store: Any, sid: str, items: list[Any]) -> dict[str, float | None]:
    """Per family, the latest recorded end of the session's stopped items (the subagent's: of
    its turns)."""
    ends: dict[str, float | None] = {}
    for item in items:
        parts = item.parts or (item,)
        for part in parts:
            key = store.keys.turn(part.id) if part.family == "turn" else None
            if part.family == "job":
                key = store.keys.job(part.id)
            when = _ts(store.redis.hget(key, "endedAt")) if key else None
            if when is not None:
                ends[item.family] = max(ends.get(item.family) or 0.0, when)
            else:
                ends.setdefault(item.family, None)
    return ends


def breakdown(
    store: Any,
    events: StopEvents,
    answered: dict[str, float],
    before: dict[str, list[Any]],
    label: str = "4",
) -> list[Row]:
    """Rows (named ``label`` hops: the benchmark's number): per family, the median and p99 of
    each hop, and the recording of quiet."""
    sids = list(answered)
    started = events.started(sids)
    hops: dict[tuple[str, str], list[float]] = defaultdict(list)
    record: list[float] = []
    to_quiet: list[float] = []
    last_family: Counter[str] = Counter()
    early: Counter[str] = Counter()  # items that ended before their stop task started
    for sid in sids:
        ends = _item_ends(store, sid, before[sid])
        for family, end in ends.items():
            got = started.get((sid, family))
            if got is None:
                continue
            hops[(family, "delivery")].append(got[0] - answered[sid])
            hops[(family, "noticing")].append(got[1] - got[0])
            if end is not None:
                hops[(family, "exiting")].append(max(0.0, end - got[1]))
                hops[(family, "ended")].append(end - answered[sid])
                early[family] += end < got[0]
        quiet = _ts(store.redis.hget(store.keys.session(sid), "quietAt"))
        if quiet is not None:
            to_quiet.append(quiet - answered[sid])
        # Each item's end: its recorded end, else (a reminder) its stop's end. Not a stop's
        # end when the item has one of its own: a turn ends before its turn.stop (a poke).
        item_end = {
            family: end if end is not None else started.get((sid, family), (0.0, None))[1]
            for family, end in ends.items()
        }
        known = {f: e for f, e in item_end.items() if e is not None}
        if known:
            last_family[max(known, key=lambda f: known[f])] += 1
        if quiet is not None and known:
            record.append(max(0.0, quiet - max(known.values())))
    rows: list[Row] = []
    for family in ("turn", "job", "reminder", "subagent"):
        parts = []
        for hop in ("delivery", "noticing", "exiting", "ended"):
            values = hops.get((family, hop))
            if values:
                parts.append(f"{hop} {ms(statistics.median(values))} (p99 {ms(pct(values, 0.99))})")
        if hops.get((family, "ended")):
            ended = len(hops[(family, "ended")])
            parts.append(f"ended before its stop task started: {early[family]} of {ended}")
        if parts:
            rows.append(
                (
                    f"{label} hops: {family}",
                    f"n={len(hops[(family, 'delivery')])}",
                    "; ".join(parts),
                    "medians (p99)",
                )
            )
    if to_quiet:
        rows.append(
            (
                f"{label} archive response -> quietAt recorded by the fleet",
                f"n={len(to_quiet)}",
                f"median {ms(statistics.median(to_quiet))}, p99 {ms(pct(to_quiet, 0.99))}",
                "goal p99 <= 300 ms: " + ("met" if pct(to_quiet, 0.99) <= 0.3 else "MISSED"),
            )
        )
    if record:
        lasts = ", ".join(f"{family} {n}" for family, n in last_family.most_common())
        rows.append(
            (
                f"{label} hops: last item's end -> quietAt recorded",
                f"n={len(record)}",
                f"median {ms(statistics.median(record))}, p99 {ms(pct(record, 0.99))}",
                f"last to end: {lasts}",
            )
        )
    return rows


def load_probe(store: Any, seconds: float = 1.0) -> tuple[float, int]:
    """The store's load just before an archive, for the figures beside it: over ``seconds``,
    the median of a ``PING`` round trip (s) and the most messages seen waiting in the turn
    work queue (steps sent and not yet taken by the turn worker)."""
    from orchestrator.families import Family, work_queue

    queue = f"{store.keys.prefix}celery:{work_queue(Family.TURN)}"
    pings: list[float] = []
    waiting = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        store.redis.ping()
        pings.append(time.perf_counter() - t0)
        waiting = max(waiting, int(store.redis.llen(queue)))
        time.sleep(0.02)
    return statistics.median(pings), waiting
