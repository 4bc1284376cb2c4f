"""Races on one lineage: archive (with and without stopActivity), unarchive, prompts, reminder
firings and subagent spawns, interleaved from several threads while the work itself runs.

The work really runs, in process: ``ExecutingDispatcher`` executes every task it is sent on a
thread pool, as the family workers would (turn steps through ``steps.run_step`` with the
scripted model and ``tools.run_tool``; stops through the orchestrator's stop functions;
reminder firings through ``turns.start_turn(source="reminder")``), and a poller thread claims
due reminders. Client threads run a seeded random schedule of operations against the same
lineage. ``FLEET_RACE_SEED=N`` replays one schedule (thread timing still varies).

The invariant checked is the gate's: once an archive of a session or of an ancestor has
committed, no step of that session is admitted until an unarchive of its lineage may have
committed. A step whose gate check preceded the archive write may still make its model request
just after it (the spec allows it), so admissions are what is timed: the script that asks the
gate and begins the step (``steps._begin_step``) is wrapped to record when each admission
began and ended, and every model request must come from
a step the gate admitted. At the end of each schedule the archive state is whole and every
archived session's census is empty once the stops have been delivered.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from orchestrator.archiving import archive, subagents
from orchestrator.census import activity
from orchestrator.errors import AncestorArchived, FleetError, SessionActive, SessionArchived
from orchestrator.families import Family, Task, work_queue
from orchestrator.models.model import Emit, ScriptedModel, StepAnswer, StepRequest
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from tests.faults.conftest import assert_consistent
from tests.helpers import wait_for

pytestmark = pytest.mark.redis

#: Schedules run by default (seeds 0..N-1).
SCHEDULES = int(os.environ.get("FLEET_RACE_SCHEDULES", "200"))
CLIENT_THREADS = 3
OPS_PER_THREAD = 4
PROMPTS = (
    "say x",
    "think 0.01\nsay x",
    "spawn say y",
    "spawn think 0.01|say y",
    "remind 0.02 say z",
    "say a\nspawn say b\nremind 0.01 say c",
)


@dataclass
class Log:
    """What happened, with ``time.monotonic()`` stamps."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: (session, started, ended) of each archive that answered archived/already_archived
    archives: list[tuple[str, float, float]] = field(default_factory=list)
    #: (session, started, ended) of each unarchive call, refused ones included
    unarchives: list[tuple[str, float, float]] = field(default_factory=list)
    #: (session, started, ended) of each admission the gate granted
    admits: list[tuple[str, float, float]] = field(default_factory=list)
    #: (session, at) of each model request
    requests: list[tuple[str, float]] = field(default_factory=list)
    refused_steps: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, name: str, row: Any) -> None:
        with self.lock:
            getattr(self, name).append(row)


class ExecutingDispatcher:
    """A ``Dispatcher`` that runs what it is sent on a thread pool, as the workers would."""

    def __init__(self, store: Store, model: Any, log: Log) -> None:
        self.store, self.model, self.log = store, model, log
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="race-worker")
        self._lock = threading.Lock()
        self.in_flight = 0

    def send(self, task: str, args: list[Any], queue: str) -> None:
        with self._lock:
            self.in_flight += 1
        self.pool.submit(self._run, task, args)

    def _run(self, task: str, args: list[Any]) -> None:
        try:
            self._execute(task, args)
        except BaseException as exc:  # noqa: BLE001 - every failure fails the test
            self.log.add("errors", f"{task}{args}: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self.in_flight -= 1

    def _execute(self, task: str, args: list[Any]) -> None:
        st = self.store
        if task == Task.TURN_STEP:
            outcome = steps.run_step(st, self, self.model, tools.run_tool, *args)
            # Refused by the gate, or dropped because an archive had stopped its turn.
            if outcome in ("refused", "cancelled", "cancelling"):
                with self.log.lock:
                    self.log.refused_steps += 1
        elif task == Task.TURN_STOP:
            turns.cancel_turns(st, self, args[0], list(args[1]))
        elif task == Task.SUBAGENT_STOP:
            for child, outcome in subagents.stop_subagents(st, self, args[0], args[1]).items():
                if outcome.startswith("error"):
                    self.log.add("errors", f"subagent.stop {child}: {outcome}")
        elif task == Task.REMINDER_STOP:
            reminders.stop_reminders(st, args[0], list(args[1]))
        elif task == Task.REMINDER_FIRE:
            # A refused firing is dropped, as the reminder worker does.
            with contextlib.suppress(FleetError):
                turns.start_turn(st, self, args[0], args[2], source="reminder", reminder_id=args[1])
        elif task == Task.JOB_STOP:
            pass  # no job is ever started here
        else:
            raise AssertionError(f"unexpected task {task}")

    def idle(self) -> bool:
        with self._lock:
            return self.in_flight == 0

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class RecordingModel(ScriptedModel):
    """The scripted model; each request is timed and must follow an admission of the same
    session on the same thread (``admitted``)."""

    def __init__(self, log: Log, admitted: threading.local) -> None:
        self.log, self.admitted = log, admitted

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        self.log.add("requests", (request.session_id, time.monotonic()))
        if getattr(self.admitted, "sid", None) != request.session_id:
            self.log.add("errors", f"model request for {request.session_id} without admission")
        return super().step(request, cancel, emit)


@pytest.fixture
def race_store(redis_url: str, key_prefix: str) -> Iterator[Store]:
    """A store on a prefix of its own (under the run's prefix, so the run cleans it up): the
    reminder poller here must claim only this test's reminders, and the run's worker
    processes must never see them."""
    s = Store(redis_url, f"{key_prefix}races-{uuid.uuid4().hex[:8]}:")
    yield s
    s.close()


def lineage_of(store: Store, sid: str) -> list[str]:
    return [sid, *store.redis.lrange(store.keys.lineage(sid), 0, -1)]


def subtree_of(store: Store, root: str) -> list[str]:
    out, queue = [], [root]
    while queue:
        sid = queue.pop()
        out.append(sid)
        queue.extend(store.redis.smembers(store.keys.children(sid)))
    return out


def violations(
    store: Store, log: Log, sids: list[str], rows: list[tuple[str, float, float]]
) -> list[str]:
    """Of ``rows`` (session, started, ended): those that began after an archive of the
    session's lineage answered, with no unarchive of that lineage overlapping the span from
    that archive's start to the row's end (an unarchive that overlaps could have committed
    first)."""
    found = []
    lineages = {sid: set(lineage_of(store, sid)) for sid in sids}
    for sid, a_start, a_end in rows:
        if sid not in lineages:
            continue
        line = lineages[sid]
        for holder, arc_start, arc_end in log.archives:
            if holder not in line or arc_end >= a_start:
                continue
            overlapped = any(
                u in line and u_end > arc_start and u_start < a_end
                for u, u_start, u_end in log.unarchives
            )
            if not overlapped:
                found.append(
                    f"step of {sid} admitted {a_start - arc_end:.4f}s after the archive of "
                    f"{holder} answered, with no unarchive in between"
                )
                break
    return found


def run_schedule(
    seed: int, store: Store, dispatcher: ExecutingDispatcher, log: Log
) -> dict[str, int]:
    """One seeded schedule on a fresh lineage (root, child, grandchild); returns counts."""
    rng = random.Random(seed)
    where = f"/tmp/fleet-races/{seed}-{uuid.uuid4().hex[:8]}"
    root = sessions.create_session(store, where).session_id
    child = sessions.create_session(store, where, parent_id=root).session_id
    grandchild = sessions.create_session(store, where, parent_id=child).session_id
    lineage = [root, child, grandchild]
    counts = {"archive": 0, "archive_stop": 0, "unarchive": 0, "prompt": 0, "fire": 0}

    def op_archive(sid: str, stop: bool) -> Callable[[], None]:
        def go() -> None:
            start = time.monotonic()
            try:
                archive.archive(store, dispatcher, sid, stop_activity=stop)
            except SessionActive:
                return
            log.add("archives", (sid, start, time.monotonic()))

        return go

    def op_unarchive(sid: str) -> Callable[[], None]:
        def go() -> None:
            start = time.monotonic()
            try:
                archive.unarchive(store, sid)
            except AncestorArchived:
                pass
            finally:
                log.add("unarchives", (sid, start, time.monotonic()))

        return go

    def op_prompt(sid: str, text: str) -> Callable[[], None]:
        def go() -> None:
            with contextlib.suppress(SessionArchived):
                turns.start_turn(store, dispatcher, sid, text)

        return go

    def op_fire(sid: str, text: str) -> Callable[[], None]:
        def go() -> None:
            dispatcher.send(
                Task.REMINDER_FIRE, [sid, "rem_manual", text], work_queue(Family.REMINDER)
            )

        return go

    plans: list[list[tuple[float, Callable[[], None]]]] = []
    for _ in range(CLIENT_THREADS):
        plan = []
        for _ in range(OPS_PER_THREAD):
            sid = rng.choice(lineage)
            kind = rng.choices(
                ["archive", "archive_stop", "unarchive", "prompt", "fire"], [2, 3, 3, 4, 2]
            )[0]
            counts[kind] += 1
            if kind == "archive":
                op = op_archive(sid, False)
            elif kind == "archive_stop":
                op = op_archive(sid, True)
            elif kind == "unarchive":
                op = op_unarchive(sid)
            elif kind == "prompt":
                op = op_prompt(sid, rng.choice(PROMPTS))
            else:
                op = op_fire(sid, rng.choice(PROMPTS))
            plan.append((rng.uniform(0, 0.012), op))
        plans.append(plan)

    def client(plan: list[tuple[float, Callable[[], None]]]) -> None:
        try:
            for pause, op in plan:
                time.sleep(pause)
                op()
        except BaseException as exc:  # noqa: BLE001 - every failure fails the test
            log.add("errors", f"client: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(plan,)) for plan in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    # Let everything the schedule started run out: no task in flight, no reminder armed.
    def settled() -> bool:
        return dispatcher.idle() and store.redis.zcard(store.keys.reminders_due) == 0

    wait_for(lambda: settled() and (time.sleep(0.02) or settled()), timeout=20, message="quiet")

    everyone = subtree_of(store, root)
    assert not log.errors, f"seed {seed}: {log.errors}"
    found = violations(store, log, everyone, log.admits)
    assert not found, f"seed {seed}: {found}"
    # Model requests that began after an archive answered: allowed (their gate check preceded
    # the write, as checked above), counted to show the window is really exercised.
    requests = [(sid, at, at) for sid, at in log.requests]
    counts["late_requests"] = len(violations(store, log, everyone, requests))
    assert_consistent(store, everyone)
    for sid in everyone:
        if sessions.get_session(store, sid).archived:
            left = activity.census(store, sid)
            assert not left, f"seed {seed}: archived {sid} still has {left}"
    counts["sessions"] = len(everyone)
    return counts


def test_no_step_is_admitted_after_an_archive_commits_in_any_interleaving(
    race_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log()
    admitted = threading.local()
    real_begin = steps._begin_step

    def timed_begin(store: Store, dispatcher: Any, session_id: str, tid: str, index: int) -> str:
        admitted.sid = None
        start = time.monotonic()
        began = real_begin(store, dispatcher, session_id, tid, index)  # a refusal propagates
        if began == "ok":
            log.add("admits", (session_id, start, time.monotonic()))
            admitted.sid = session_id
        return began

    monkeypatch.setattr(steps, "_begin_step", timed_begin)
    dispatcher = ExecutingDispatcher(race_store, RecordingModel(log, admitted), log)
    stop_poller = threading.Event()

    def poll() -> None:
        while not stop_poller.wait(0.005):
            try:
                reminders.poll_once(race_store, dispatcher)
            except BaseException as exc:  # noqa: BLE001 - every failure fails the test
                log.add("errors", f"poller: {type(exc).__name__}: {exc}")

    poller = threading.Thread(target=poll, name="race-poller", daemon=True)
    poller.start()
    only = os.environ.get("FLEET_RACE_SEED")
    seeds = [int(only)] if only else list(range(SCHEDULES))
    totals: dict[str, int] = {}
    started = time.monotonic()
    try:
        for seed in seeds:
            for name, n in run_schedule(seed, race_store, dispatcher, log).items():
                totals[name] = totals.get(name, 0) + n
    finally:
        stop_poller.set()
        poller.join(timeout=5)
        dispatcher.close()
    print(
        f"\n{len(seeds)} schedules in {time.monotonic() - started:.1f}s: {totals}; "
        f"{len(log.archives)} archives answered, {len(log.unarchives)} unarchives, "
        f"{len(log.admits)} admissions, {log.refused_steps} steps refused or stopped, "
        f"{len(log.requests)} model requests"
    )
    assert log.refused_steps > 0  # the schedules did reach steps of archived lineages
