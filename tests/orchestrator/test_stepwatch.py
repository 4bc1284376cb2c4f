"""The steps a process has in flight share one watch (``orchestrator/stepwatch.py``): one
thread and one script call per poll for all of them, each step still told when its own turn
stops running or another copy of it began."""

from __future__ import annotations

import threading

from orchestrator import sessions, steps, turns
from orchestrator.fencing import StepGuard
from orchestrator.store import Store
from tests.helpers import RecordingDispatcher

TOKEN, OTHER = "token-of-this-copy", "token-of-another-copy"


def _in_flight(store: Store, cwd: str) -> str:
    sid = sessions.create_session(store, cwd).session_id
    tid = turns.start_turn(store, RecordingDispatcher(), sid, "think 60")
    assert store.run("turn_begin_step", [tid, 0, steps.STEP_LEASE_MS, TOKEN])[0] == "ok"
    return tid


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("watch-", "step-watch"))]


def test_steps_in_flight_share_one_watch_and_each_hears_its_own_stop(
    store: Store, cwd: str
) -> None:
    # Given five steps in flight in this process, each under its watch
    tids = [_in_flight(store, cwd) for _ in range(5)]
    watches = [steps._StepWatch(store, StepGuard(tid, TOKEN), None, lambda: None) for tid in tids]
    for w in watches:
        w.__enter__()
    try:
        # Then one thread polls for all of them
        assert len(_watch_threads()) == 1
        # When the first turn is stopped and another copy of the second step begins
        store.redis.hset(store.keys.turn(tids[0]), "state", "cancelling")
        store.redis.delete(store.keys.step_lease(tids[1]))
        assert store.run("turn_begin_step", [tids[1], 0, steps.STEP_LEASE_MS, OTHER])[0] == "ok"
        # Then each of those two steps is told, as it would be alone, and the others are not
        assert watches[0].cancel.wait(10) and watches[0].stopped
        assert watches[1].cancel.wait(10) and watches[1].superseded
        assert not any(w.cancel.is_set() for w in watches[2:])
        # And the others' leases are still held by this copy
        assert all(store.redis.get(store.keys.step_lease(t)) == TOKEN for t in tids[2:])
    finally:
        for w in watches:
            w.__exit__(None, None, None)
