"""Helpers for the worker tests: they read what the real workers wrote (Redis records, worker
logs, live processes) and never reach into a worker's memory."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import redis

from orchestrator.census.activity import census
from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.turn.turns import get_turn
from tests.helpers import wait_for

ALL_FAMILIES = frozenset({"turn", "job", "subagent", "reminder"})


def new_session(store: Any, parent_id: str | None = None) -> str:
    """A fresh session in ``/tmp`` (a subagent of ``parent_id`` when given)."""
    return create_session(store, "/tmp", parent_id=parent_id).session_id


def history(store: Any, sid: str) -> list[dict[str, Any]]:
    """The session's ``session/update`` payloads, oldest first."""
    return [json.loads(raw) for raw in store.redis.lrange(store.keys.history(sid), 0, -1)]


def model_requests(store: Any, sid: str) -> list[dict[str, Any]]:
    """Every model request recorded for the session (turnId, step, at)."""
    return [json.loads(raw) for raw in store.redis.lrange(store.keys.model_requests(sid), 0, -1)]


def requests_of(store: Any, sid: str, tid: str) -> list[int]:
    """The step indexes of the model requests made for one turn, in order."""
    return [r["step"] for r in model_requests(store, sid) if r["turnId"] == tid]


def turns_of(store: Any, sid: str) -> list[str]:
    """Ids of every turn started in the session (each records its prompt first)."""
    return [u["turnId"] for u in history(store, sid) if u["sessionUpdate"] == "user_message_chunk"]


def turn_state(store: Any, tid: str) -> str | None:
    """The stored state of a turn (``None`` when there is no such turn)."""
    turn = get_turn(store, tid)
    return None if turn is None else turn.state.value


def wait_turn_state(store: Any, tid: str, state: str, timeout: float = 15.0) -> None:
    """Wait until the turn is in ``state``."""
    wait_for(
        lambda: turn_state(store, tid) == state,
        timeout,
        message=f"turn {tid} to be {state} (it is {turn_state(store, tid)})",
    )


def wait_request(store: Any, sid: str, tid: str, step: int, timeout: float = 15.0) -> None:
    """Wait until the model request of step ``step`` of a turn has been made."""
    wait_for(
        lambda: step in requests_of(store, sid, tid),
        timeout,
        message=f"the model request of step {step} of turn {tid}",
    )


def families(store: Any, sid: str) -> set[str]:
    """The families with live items in the session's census."""
    return {item.family.value for item in census(store, sid)}


def wait_families(store: Any, sid: str, expected: set[str], timeout: float = 15.0) -> None:
    """Wait until the census shows exactly the ``expected`` families."""
    wait_for(
        lambda: families(store, sid) == expected,
        timeout,
        message=f"census of {sid} to show {sorted(expected)}",
    )


def wait_drained(store: Any, sid: str, timeout: float = 15.0) -> None:
    """Wait until nothing is live in the session or its subtree."""
    wait_for(
        lambda: not census(store, sid),
        timeout,
        message=f"census of {sid} to be empty",
    )


def item_of(store: Any, sid: str, family: str) -> Any:
    """The single live census item of ``family`` in the session."""
    found = [i for i in census(store, sid) if i.family.value == family]
    assert len(found) == 1, f"expected one live {family} in {sid}, got {found}"
    return found[0]


def job_record(store: Any, jid: str) -> dict[str, str]:
    """The job's stored hash."""
    record: dict[str, str] = store.redis.hgetall(store.keys.job(jid))
    return record


def wait_job_pid(store: Any, jid: str, timeout: float = 15.0) -> int:
    """Wait until the job's process runs and return its pid."""
    pid = wait_for(
        lambda: job_record(store, jid).get("pid"), timeout, message=f"job {jid} to get a pid"
    )
    return int(pid)


def process_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout: float = 15.0) -> None:
    """Wait until ``pid`` no longer runs."""
    wait_for(lambda: not process_alive(pid), timeout, message=f"process {pid} to end")


def worker(fleet: Any, family: str, host: str | None = None) -> Any:
    """The fleet's worker of ``family`` (on ``host`` for job workers), not its control-only
    one."""
    for w in fleet.workers:
        if w.family.value == family and not w.control and (host is None or w.host == host):
            return w
    raise AssertionError(f"no {family} worker on {host}")


def stop_takers(fleet: Any, family: str) -> list[Any]:
    """Every worker of ``family`` that may take its stops: its workers and its control-only
    one (both consume ``<family>.ctl``)."""
    return [w for w in fleet.workers if w.family.value == family]


def job_workers(fleet: Any) -> list[Any]:
    """The fleet's job workers, one per host."""
    return [w for w in fleet.workers if w.family is Family.JOB]


def log_text(w: Any) -> str:
    """Everything a worker has logged so far."""
    return str(w.log_path.read_text(errors="replace"))


def wait_log(w: Any, needle: str, count: int = 1, timeout: float = 30.0) -> None:
    """Wait until ``needle`` appears ``count`` times in the worker's log."""
    wait_for(
        lambda: log_text(w).count(needle) >= count,
        timeout,
        message=f"{needle!r} x{count} in {w.log_path.name}",
    )


def wait_log_of_any(workers: list[Any], needle: str, timeout: float = 30.0) -> Any:
    """Wait until ``needle`` appears in the log of one of ``workers``; returns that worker."""

    def found() -> Any:
        return next((w for w in workers if needle in log_text(w)), None)

    names = ", ".join(w.log_path.name for w in workers)
    return wait_for(found, timeout, message=f"{needle!r} in one of {names}")


def active_step(app: Any, turn_id: str, workers: int = 1) -> tuple[str, str] | None:
    """(worker name, Celery task id) of a step of ``turn_id`` running now, as Celery's remote
    control (``inspect().active()`` on ``app``, waiting for ``workers`` replies at most 2 s)
    reports it; ``None`` when no worker reports one."""
    active = app.control.inspect(timeout=2.0, limit=workers).active() or {}
    for name, tasks in active.items():
        for task in tasks:
            if turn_id in json.dumps(task.get("args")):
                return name, str(task["id"])
    return None


def worker_running(app: Any, fleet: Any, turn_id: str, timeout: float = 30.0) -> Any:
    """The worker of ``fleet`` (a ``WorkerProcess``) running a step of ``turn_id`` now
    (``active_step``). Fails the test when none reports one within ``timeout`` seconds."""

    def find() -> Any:
        live = [w for w in fleet.workers if w.process.poll() is None]
        found = active_step(app, turn_id, len(live))
        for w in live:
            if found and w.node == found[0]:
                return w
        return None

    return wait_for(find, timeout, message=f"a worker running a step of {turn_id}")


def sleep_processes(root_pid: int, seconds: str) -> list[psutil.Process]:
    """Live ``sleep <seconds>`` processes descending from ``root_pid`` (each test uses its
    own odd duration, so the processes of one test are told apart from the others')."""
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in children:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if proc.cmdline() == ["sleep", seconds] and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def reminder_state(store: Any, rid: str) -> str | None:
    """The stored state of a reminder (``armed``, ``fired`` or ``deleted``)."""
    state: str | None = store.redis.hget(store.keys.reminder(rid), "state")
    return state


def reminder_due_ms(store: Any, rid: str) -> int:
    """When an armed reminder is due (epoch ms)."""
    score = store.redis.zscore(store.keys.reminders_due, rid)
    assert score is not None, f"reminder {rid} is not armed"
    return int(score)


def wait_until_ms(epoch_ms: int, timeout: float = 30.0) -> None:
    """Let wall-clock time pass ``epoch_ms`` (used only for due times, with a control)."""
    wait_for(lambda: time.time() * 1000 > epoch_ms, timeout, message=f"time {epoch_ms}")


@contextlib.contextmanager
def paused_consumer(app: Any, node: str, queue: str) -> Iterator[None]:
    """Make worker ``node`` stop consuming ``queue`` for the block (Celery remote control),
    so messages sent to it wait there; consuming resumes on exit, even when the test fails."""
    reply = app.control.cancel_consumer(queue, destination=[node], reply=True, timeout=5)
    assert reply and "ok" in reply[0].get(node, {}), f"could not pause {queue} on {node}: {reply}"
    try:
        yield
    finally:
        resumed = app.control.add_consumer(queue, destination=[node], reply=True, timeout=5)
        if not (resumed and "ok" in resumed[0].get(node, {})):
            pytest.fail(f"could not resume {queue} on {node}: {resumed}")


def subscribe_events(app: Any) -> Any:
    """A subscription to every channel of ``app``'s broker prefix (where Flower reads the
    ``task-sent`` events), already confirmed."""
    events = redis.Redis.from_url(app.conf.broker_url).pubsub()
    events.psubscribe(f"{app.conf.broker_transport_options['global_keyprefix']}*")
    assert events.get_message(timeout=5)["type"] == "psubscribe"
    return events


def next_events(events: Any, n: int) -> list[dict[str, Any]]:
    """The next ``n`` messages published to ``events``, decoded as written (envelope and all);
    fails when fewer arrive within 5 s of each other."""
    out = []
    while len(out) < n and (msg := events.get_message(timeout=5)) is not None:
        if msg["type"] == "pmessage":
            out.append(json.loads(msg["data"]))
    assert len(out) == n
    return out
