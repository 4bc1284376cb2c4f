"""The steps a process has in flight share one watch (``orchestrator/turn/stepwatch.py``): one
thread and one script call per poll for all of them, each step still told when its own turn
stops running or another copy of it began."""

from __future__ import annotations

import threading

from orchestrator.archiving import archive
from orchestrator.session import gate, sessions
from orchestrator.session.fencing import StepGuard
from orchestrator.storage.store import Store
from orchestrator.turn import steps, stepwatch, turns
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import begin_step

TOKEN, OTHER = "token-of-this-copy", "token-of-another-copy"


def _in_flight(store: Store, cwd: str) -> tuple[str, str]:
    """A turn of a new session with its first step begun by this copy: (sid, tid)."""
    sid = sessions.create_session(store, cwd).session_id
    tid = turns.start_turn(store, RecordingDispatcher(), sid, "think 60")
    assert begin_step(store, tid, lease_ms=steps.STEP_LEASE_MS, token=TOKEN)
    return sid, tid


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("watch-", "step-watch"))]


def test_steps_in_flight_share_one_watch_and_each_hears_its_own_stop(
    store: Store, cwd: str
) -> None:
    # Given five steps in flight in this process, each under its watch
    flights = [_in_flight(store, cwd) for _ in range(5)]
    tids = [tid for _, tid in flights]
    watches = [
        steps._StepWatch(store, StepGuard(tid, TOKEN), None, lambda: None, sid)
        for sid, tid in flights
    ]
    for w in watches:
        w.__enter__()
    try:
        # Then one thread polls for all of them
        assert len(_watch_threads()) == 1
        # When the first turn is stopped and another copy of the second step begins
        store.redis.hset(store.keys.turn(tids[0]), "state", "cancelling")
        store.redis.delete(store.keys.step_lease(tids[1]))
        assert begin_step(store, tids[1], lease_ms=steps.STEP_LEASE_MS, token=OTHER)
        # Then each of those two steps is told, as it would be alone, and the others are not
        assert watches[0].cancel.wait(10) and watches[0].stopped
        assert watches[1].cancel.wait(10) and watches[1].superseded
        assert not any(w.cancel.is_set() for w in watches[2:])
        # And the others' leases are still held by this copy
        assert all(store.redis.get(store.keys.step_lease(t)) == TOKEN for t in tids[2:])
    finally:
        for w in watches:
            w.__exit__(None, None, None)


def test_an_archive_wakes_the_watch_of_its_sessions_steps_before_the_next_poll(
    store: Store, cwd: str
) -> None:
    # Given two steps in flight under a shared poll that polls only every 30 s
    (sid, tid), (other_sid, other_tid) = _in_flight(store, cwd), _in_flight(store, cwd)
    poll = stepwatch._Poll(store, 30.0, 60.0)
    watch = steps._StepWatch(store, StepGuard(tid, TOKEN), None, lambda: None, sid)
    other = steps._StepWatch(store, StepGuard(other_tid, TOKEN), None, lambda: None, other_sid)
    poll.add(watch)
    poll.add(other)
    try:
        wait_for(lambda: gate.listening(store) is not None, 10, message="the poll to listen")
        subscribed = gate.listening(store)
        assert subscribed is not None and subscribed.wait(10), "no subscription to closures"
        # When the first step's session is archived with stopActivity
        archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)
        # Then its step is told at once, long before the next poll
        assert watch.cancel.wait(10) and watch.stopped
        # And the other step is not
        assert not other.cancel.is_set()
    finally:
        poll.remove(watch)
        poll.remove(other)
