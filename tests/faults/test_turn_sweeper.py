"""The turn sweeper with real worker processes: a turn whose step is lost with its worker still
reaches a final state, through the sweeper running in the surviving turn worker.

The module runs turn workers of its own (run prefix + ``sweeper:``) with a visibility timeout
of 10 minutes, so the killed worker's unacknowledged step never comes back within a test: only
the sweeper can move the turn (``FLEET_TURN_STUCK_SECONDS=2``, a pass every 0.5 s). Each test
starts a second turn worker before its turn (starting one inside the step's window would race
it on a loaded machine), then SIGKILLs by PID the one running the step.

The running-turn index entry a step would write when it begins is written by the test (with
Redis's clock), so the tests do not depend on who maintains that index."""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.families import Family
from orchestrator.session.sessions import create_session, get_session
from orchestrator.storage.store import Store
from orchestrator.turn.turns import start_turn
from tests.faults.fleets import PrivateFleet, private_fleet, sweeping
from tests.helpers import STARTUP_TIMEOUT, wait_for
from tests.workers.support import requests_of, wait_request, wait_turn_state, worker_running

# The module's fleet and a second worker start (STARTUP_TIMEOUT each) before what it checks.
pytestmark = pytest.mark.timeout(2 * STARTUP_TIMEOUT + 90)


#: Host names of the turn workers the tests add (each new: a heartbeat under a reused name
#: would count a worker still starting as ready).
_HOSTS = (f"sweeper-{n}" for n in itertools.count(1))


def second_worker(private: PrivateFleet) -> None:
    """Start another turn worker and wait for its heartbeat."""
    private.fleet.start_worker(Family.TURN, next(_HOSTS))
    private.fleet.wait_ready(STARTUP_TIMEOUT)


def kill_the_step(private: PrivateFleet, tid: str) -> None:
    """SIGKILL the turn worker running a step of ``tid`` and reap it; the other stays."""
    old = worker_running(private.dispatcher.app, private.fleet, tid)
    old.process.send_signal(signal.SIGKILL)
    old.process.wait(10)
    private.fleet.workers.remove(old)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = sweeping(2)
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "sweeper", [Family.TURN], env
    ) as fleet:
        yield fleet


def began(store: Store, tid: str) -> None:
    """Index the turn as progressing now, as its step did when it began."""
    sec, usec = store.redis.time()
    store.redis.zadd(store.keys.turns_inflight, {tid: int(sec) * 1000 + int(usec) // 1000})


def turn_events(store: Store, tid: str) -> list[dict[str, object]]:
    rows = store.redis.xrange(store.keys.event_stream, "-", "+")
    events = [json.loads(fields["event"]) for _, fields in rows]
    return [e for e in events if e.get("type") == "turn" and e.get("turnId") == tid]


def test_a_turn_whose_worker_is_killed_mid_step_is_resumed_on_another_worker(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given a turn in the middle of a 12 s model request (the resumed copy runs it again), and
    # a second turn worker up
    second_worker(private)
    sid = create_session(store, "/tmp/faults-sweeper").session_id
    tid = start_turn(store, dispatcher, sid, "think 12")
    wait_request(store, sid, tid, 0)
    began(store, tid)

    # When its worker is SIGKILLed (the step's message is not redelivered for 10 minutes)
    kill_the_step(private, tid)

    # Then the sweeper finds the step lost once its lease lapsed, and dispatches it again
    wait_for(lambda: requests_of(store, sid, tid) == [0, 0], 30, message="the step resumed")
    assert store.redis.hget(store.keys.turn(tid), "resumes") == "1"
    # And the turn runs to its end
    wait_turn_state(store, tid, "completed", timeout=60)
    # (its end event is published after its state is written)
    wait_for(
        lambda: any(e["state"] == "completed" for e in turn_events(store, tid)),
        15,
        message="the turn's end event",
    )
    assert turn_events(store, tid)[-1]["state"] == "completed"


def test_a_killed_step_then_archive_with_stop_ends_the_turn_cancelled_not_cancelling_forever(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given a turn in the middle of a 30 s model request, and a second turn worker up
    second_worker(private)
    sid = create_session(store, "/tmp/faults-sweeper").session_id
    tid = start_turn(store, dispatcher, sid, "think 30\nsay never")
    wait_request(store, sid, tid, 0)
    began(store, tid)

    # When its worker is SIGKILLed and the session archived with stopActivity: the other
    # worker takes the stop while the dead step's lease still holds, so the turn is cancelling
    kill_the_step(private, tid)
    result = archive(store, dispatcher, sid, stop_activity=True)
    assert result.outcome == "archived" and result.stop_report.sent == {"turn": 1}
    wait_turn_state(store, tid, "cancelling")

    # Then once the lease lapsed the sweeper settles it cancelled, with its turn event (which
    # answers a pending ACP session/prompt), and the archive is recorded quiet
    wait_turn_state(store, tid, "cancelled", timeout=30)
    # (its end event is published after its state is written)
    wait_for(
        lambda: any(e["state"] == "cancelled" for e in turn_events(store, tid)),
        15,
        message="the turn's end event",
    )
    assert turn_events(store, tid)[-1]["stopReason"] == "cancelled"
    wait_for(lambda: get_session(store, sid).quiet_at is not None, 10, message="quiet")
    # And no step ran after the archive
    assert requests_of(store, sid, tid) == [0]
