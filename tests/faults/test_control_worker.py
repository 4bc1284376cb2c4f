"""The turn family's control-only worker (``fleet worker --family turn --control``): a stop is
taken while every thread of the turn worker is held by a step, and the control worker takes
nothing but stops.

A private fleet: one turn worker with a single thread, and its control-only worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from api.local import WorkerProcess
from orchestrator.families import Family, Task, control_queue
from orchestrator.heartbeats import live_workers
from orchestrator.sessions import create_session
from orchestrator.turns import start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.workers.support import log_text, wait_log, wait_request, wait_turn_state

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    with private_fleet(
        redis_url,
        key_prefix,
        tmp_path_factory,
        "ctl",
        [Family.TURN],
        {},
        concurrency=1,
        control=(Family.TURN,),
    ) as fleet:
        yield fleet


def control_worker(private: PrivateFleet) -> WorkerProcess:
    [found] = [w for w in private.fleet.workers if w.control]
    return found


def test_a_turn_stop_is_taken_while_the_turn_workers_only_thread_runs_a_long_step(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given the turn worker's one thread held by a 60 s model step
    sid = create_session(store, "/tmp/ctl").session_id
    tid = start_turn(store, dispatcher, sid, "think 60")
    wait_request(store, sid, tid, 0)
    # And another session's turn queued behind it
    other = create_session(store, "/tmp/ctl").session_id
    queued = start_turn(store, dispatcher, other, "say after")
    # When a stop for the running turn is sent to the turn family's control queue, as an
    # archive's fan-out sends it
    dispatcher.send(Task.TURN_STOP, [sid, [tid]], control_queue(Family.TURN))
    # Then the turn ends cancelled long before its step would have (the turn worker could
    # take the stop only once its thread is free: after 60 s)
    wait_turn_state(store, tid, "cancelled", timeout=20)
    # And the control worker ran the stop, and only stops: the queued turn runs on the turn
    # worker once its thread is free
    ctl = control_worker(private)
    wait_log(ctl, "Task turn.stop[", timeout=10)
    wait_turn_state(store, queued, "completed", timeout=30)
    assert "turn.step" not in log_text(ctl), log_text(ctl)[-2000:]


def test_a_control_worker_beats_as_its_queue_and_is_not_counted_as_the_familys_worker(
    private: PrivateFleet,
) -> None:
    store = private.store
    ctl = control_worker(private)
    assert ctl.node == "turn.ctl@ctl"
    # Its heartbeat is its own ...
    assert store.redis.exists(store.keys.worker_heartbeat("turn.ctl", "turn.ctl@ctl"))
    # ... and readiness counts only the worker that runs the family's work
    assert live_workers(store)["turn"] == ["turn@ctl"]
