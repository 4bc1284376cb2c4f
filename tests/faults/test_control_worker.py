"""Control-only workers (``fleet worker --family F --control``). The turn family's takes a
stop while every thread of the turn worker is held by a step, and nothing but stops; the
subagent and reminder families' take those families' stops on their own (``fleet up`` runs
all three).

Private fleets: one turn worker with a single thread and its control-only worker; the
control-only subagent and reminder workers without their families' own workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localfleet.fleet import LocalFleet, WorkerProcess
from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.families import Family, Task, control_queue
from orchestrator.reminder.reminders import create_reminder
from orchestrator.session.sessions import create_session
from orchestrator.storage.heartbeats import live_workers
from orchestrator.turn.turns import start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import wait_for
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


@pytest.fixture(scope="module")
def stop_workers_only(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    """The control-only workers of the subagent and reminder families, and no other worker of
    those families (one turn worker, which no test here sends anything)."""
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "ctlsr", [Family.TURN], {}
    ) as private:
        for family in (Family.SUBAGENT, Family.REMINDER):
            private.fleet.start_worker(family, "ctlsr", control=True)
        private.fleet.wait_ready(60)
        yield private


def test_fleet_up_runs_a_control_worker_for_every_family_that_can_have_one() -> None:
    # The job family's stops run on the host owning the process: no control worker for it
    assert set(LocalFleet("redis://unused", "p:", Path("/unused")).control_families) == {
        Family.TURN,
        Family.SUBAGENT,
        Family.REMINDER,
    }


def test_subagent_and_reminder_stops_are_taken_by_their_control_workers_alone(
    stop_workers_only: PrivateFleet,
) -> None:
    private = stop_workers_only
    store, dispatcher = private.store, private.dispatcher
    # Given a session with a stored reminder and a subagent whose own reminder is its live
    # work
    sid = create_session(store, "/tmp/ctlsr").session_id
    own = create_reminder(store, sid, 3600, "say later")
    child = create_session(store, "/tmp/ctlsr", parent_id=sid).session_id
    childs = create_reminder(store, child, 3600, "say later")
    assert {i.family for i in census(store, sid)} == {Family.REMINDER, Family.SUBAGENT}
    # When the session is archived with stopActivity
    result = archive(store, dispatcher, sid, stop_activity=True)
    assert set(result.stop_report.sent) == {Family.SUBAGENT, Family.REMINDER}
    # Then both stops are taken by the control-only workers (no other worker consumes those
    # queues): the census empties and both reminders are deleted
    wait_for(lambda: not census(store, sid), 20, message="the census to empty")
    for rid in (own, childs):
        assert store.redis.hget(store.keys.reminder(rid), "state") == "deleted"
    by_family = {w.family: w for w in private.fleet.workers if w.control}
    wait_log(by_family[Family.SUBAGENT], "Task subagent.stop[", timeout=10)
    wait_log(by_family[Family.REMINDER], "Task reminder.stop[", timeout=10)
