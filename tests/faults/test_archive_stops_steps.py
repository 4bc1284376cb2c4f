"""No step after an acknowledged archive, on a turn worker of this module's own (run prefix +
``faults-steps:``), so stopping it with SIGSTOP or SIGTERM never disturbs the shared ``fleet``.
There is no subagent worker: a subagent's turn is stopped by the archive's own script or not at
all.

The claims are read from the store: a model request is recorded by the script that admits its
step, and the conversation is the history list, so "nothing after the archive" is "the lists
do not grow after the archive call returned" (every write after it is refused)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.families import Family
from orchestrator.job import scripts as job_scripts
from orchestrator.session import gate
from orchestrator.session.fencing import StepGuard
from orchestrator.session.sessions import create_session, get_session
from orchestrator.storage.store import Store
from orchestrator.turn import scripts as turn_scripts
from orchestrator.turn.turns import TurnState, get_turn, start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import begin_step
from tests.workers.support import (
    history,
    sleep_processes,
    turns_of,
    wait_drained,
    wait_request,
    wait_turn_state,
)

pytestmark = pytest.mark.timeout(240)

FINAL = {s.value for s in TurnState} - {"queued", "running", "cancelling"}


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = {"FLEET_VISIBILITY_TIMEOUT_SECONDS": "3"}
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "faults-steps", [Family.TURN], env
    ) as fleet:
        yield fleet


def lengths(store: Store, sid: str) -> tuple[int, int]:
    """(model requests, conversation updates) recorded for the session."""
    k = store.keys
    return int(store.redis.llen(k.model_requests(sid))), int(store.redis.llen(k.history(sid)))


def wait_final(store: Store, tid: str, timeout: float = 30.0) -> str:
    """Wait until the turn is in a terminal state; return it."""
    found: str = wait_for(
        lambda: (t := get_turn(store, tid)) is not None and t.state.value in FINAL and t.state,
        timeout,
        message=f"turn {tid} to end",
    )
    return str(found)


def test_a_worker_stopped_mid_turn_lands_nothing_after_an_archive_with_stop(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    private.restart(Family.TURN)
    prompt = "\n".join(["say hello"] * 300)
    grown: list[str] = []
    for n in range(12):
        # Given a session streaming a 300-step turn
        sid = create_session(store, "/tmp/faults-steps").session_id
        tid = start_turn(store, dispatcher, sid, prompt)
        wait_request(store, sid, tid, 3 + n % 5)
        # When its turn worker is stopped (SIGSTOP), the session archived with stopActivity,
        # and the worker continued 50 ms later
        private.signal(Family.TURN, signal.SIGSTOP)
        try:
            result = archive(store, dispatcher, sid, stop_activity=True)
            at_archive = lengths(store, sid)
            time.sleep(0.05)  # the scenario's pause, not a wait for a condition
        finally:
            private.signal(Family.TURN, signal.SIGCONT)
        assert result.outcome == "archived"
        # Then the turn ends, and nothing was admitted or said after the archive returned
        wait_final(store, tid)
        wait_drained(store, sid)
        if lengths(store, sid) != at_archive:
            grown.append(f"{sid}: {at_archive} -> {lengths(store, sid)}")
    assert grown == []


def test_a_step_begun_after_the_archive_committed_is_refused_in_the_same_script(
    store: Store,
) -> None:
    # Given a running turn whose step passed the gate
    recorder = RecordingDispatcher()
    sid = create_session(store, "/tmp/faults-steps").session_id
    tid = start_turn(store, recorder, sid, "say hi\nsay again")
    gate.admit(store, sid)
    # When the archive commits before the step begins
    archive(store, recorder, sid, stop_activity=True)
    began = begin_step(store, tid)
    # Then the step is not admitted: no lease, no model request, nothing in the conversation
    assert not began
    assert not store.redis.exists(store.keys.step_lease(tid))
    assert lengths(store, sid) == (0, 0)
    turn = get_turn(store, tid)
    assert turn is not None and turn.state.value in FINAL


def test_a_step_in_flight_when_its_lineage_is_archived_lands_nothing_after_it(
    store: Store,
) -> None:
    # Given a subagent whose step has begun (the archive finds it in flight)
    recorder = RecordingDispatcher()
    parent = create_session(store, "/tmp/faults-steps").session_id
    child = create_session(store, "/tmp/faults-steps", parent_id=parent).session_id
    tid = start_turn(store, recorder, child, "say hi", source="subagent")
    assert begin_step(store, tid)
    before = lengths(store, child)
    # When the parent is archived with stopActivity
    archive(store, recorder, parent, stop_activity=True)
    # Then the step's writes are refused: its answer and a tool launch alike
    update = json.dumps({"sessionUpdate": "tool_call_update", "turnId": tid, "status": "x"})
    for settle in (False, True):  # not even a settlement
        recorded = turn_scripts.turn_record(store, turn_id=tid, update_json=update, settle=settle)
        assert recorded is turn_scripts.Recorded.STOPPED
    late = job_scripts.job_create(
        store,
        job_id="job_late",
        session_id=child,
        label="x",
        seconds=1,
        now_iso="now",
        start_timeout_ms=1000,
        guard=StepGuard(tid, ""),
        max_live=100,
        command="",
    )
    assert isinstance(late, job_scripts.GuardLost)
    assert lengths(store, child) == before


def test_a_stop_reaches_a_step_whose_worker_is_shutting_down(private: PrivateFleet) -> None:
    store, dispatcher = private.store, private.dispatcher
    private.restart(Family.TURN)
    w = private.worker(Family.TURN)
    # Given a turn running a 40.3 s child process
    sid = create_session(store, "/tmp/faults-steps").session_id
    tid = start_turn(store, dispatcher, sid, "exec 40.3")
    [child] = wait_for(
        lambda: sleep_processes(w.process.pid, "40.3"), 15, message="the exec child process"
    )
    # When the turn worker is asked to shut down (SIGTERM, Celery's warm shutdown), and the
    # session is archived with stopActivity a second later
    private.signal(Family.TURN, signal.SIGTERM)
    time.sleep(1.0)  # the scenario's delay, not a wait for a condition
    archive(store, dispatcher, sid, stop_activity=True)
    # Then the child process dies, long before its 40 s are up (the bound is only generous)
    wait_for(lambda: not child.is_running(), 20, message="the exec child to die")
    # And the tool call does not end completed
    wait_final(store, tid, 15)
    statuses = [
        u.get("status") for u in history(store, sid) if u["sessionUpdate"] == "tool_call_update"
    ]
    assert "completed" not in statuses
    # (the worker finishes its warm shutdown; a fresh one replaces it)
    w.process.wait(30)
    private.restart(Family.TURN)


def test_a_subagent_finishing_after_its_parents_archive_adds_nothing_to_the_parent(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    private.restart(Family.TURN)
    # Given a parent that spawned a subagent now in a 3 s model request (no subagent worker
    # runs: only the archive itself can stop the child's turn)
    parent = create_session(store, "/tmp/faults-steps").session_id
    tid = start_turn(store, dispatcher, parent, "spawn think 3")
    wait_turn_state(store, tid, "completed")
    [child] = store.redis.smembers(store.keys.children(parent))
    child_tid = wait_for(lambda: turns_of(store, child), 15, message="the child's turn")[0]
    wait_request(store, child, child_tid, 0)
    # When the parent is archived with stopActivity
    archive(store, dispatcher, parent, stop_activity=True)
    archived = get_session(store, parent)
    at_archive = lengths(store, parent)
    # Then the child's turn ends without waking its parent: the parent's conversation and
    # updatedAt stay as the archive left them
    wait_final(store, child_tid, 15)
    wait_drained(store, parent)
    assert lengths(store, parent) == at_archive
    assert get_session(store, parent).updated_at == archived.updated_at
    assert store.redis.zcard(store.keys.live_turns(parent)) == 0


def test_a_frozen_turn_workers_shell_command_is_dead_once_its_turn_no_longer_counts(
    private: PrivateFleet,
) -> None:
    # The command's exec watchdog (orchestrator/process/execwatch.py) kills it before its step's
    # lease lapses: when the census stops counting the turn, no process of it runs; and the
    # worker, once resumed, keeps working.
    store, dispatcher = private.store, private.dispatcher
    worker = private.worker(Family.TURN).process.pid
    # (whose exec warden the worker started when it was ready, not with the command)
    wait_for(
        lambda: [
            p
            for p in psutil.Process(worker).children()
            if "orchestrator.process.execwatch" in " ".join(p.cmdline())
        ],
        30,
        message="the turn worker's exec warden",
    )
    # Given a turn whose step runs a 121.3 s shell command
    sid = create_session(store, "/tmp/frozen-turn").session_id
    tid = start_turn(store, dispatcher, sid, "exec 121.3\nsay never")
    wait_for(lambda: sleep_processes(worker, "121.3"), 30, message="the shell command to run")

    # When its turn worker is frozen (SIGSTOP by PID; its children are not), and the session
    # is archived with stopActivity (the stop and the step both wait on the frozen worker)
    private.signal(Family.TURN, signal.SIGSTOP)
    try:
        result = archive(store, dispatcher, sid, stop_activity=True)
        assert result.outcome == "archived"
        # Then while the census counts the turn, and once it does not, the check holds: when
        # it stops counting, the command is already dead
        wait_for(lambda: not census(store, sid), 20, message="the census to empty")
        assert not sleep_processes(worker, "121.3"), "the census is empty over a live command"
    finally:
        # When the worker resumes
        private.signal(Family.TURN, signal.SIGCONT)

    # Then the turn ended and the worker keeps working: a new session's turn completes
    wait_for(
        lambda: (t := get_turn(store, tid)) is not None and t.state.value != "cancelling",
        15,
        message="the turn to settle",
    )
    sid2 = create_session(store, "/tmp/frozen-turn").session_id
    tid2 = start_turn(store, dispatcher, sid2, "say back")
    wait_for(
        lambda: (t := get_turn(store, tid2)) is not None and t.state.value == "completed",
        30,
        message="a new turn to complete",
    )
