"""The step gate as the turn workers apply it: steps of archived lineages are refused before
any model request, duplicate deliveries are dropped, and unarchive restarts nothing."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.archiving.archive import archive, unarchive
from orchestrator.census.activity import census
from orchestrator.errors import SessionArchived
from orchestrator.job import scripts as job_scripts
from orchestrator.session.sessions import create_session, get_session
from orchestrator.storage.store import iso, new_id, now_ms
from orchestrator.turn.turns import start_turn
from tests.helpers import FaultyDispatcher, RecordingDispatcher, wait_for
from tests.orchestrator.support import begin_step
from tests.workers.support import (
    history,
    item_of,
    job_record,
    job_workers,
    log_text,
    model_requests,
    requests_of,
    sleep_processes,
    turn_state,
    wait_drained,
    wait_gone,
    wait_job_pid,
    wait_log,
    wait_request,
    wait_turn_state,
    worker,
)

pytestmark = pytest.mark.timeout(60)


def test_a_step_for_an_archived_session_is_refused_without_a_model_request(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn whose step was in flight when its session was archived with stopActivity
    # (the archive marked it cancelling), its first copy holding the step's lease (so neither
    # the sweeper nor a census settles the turn meanwhile) and its turn.stop lost: the copy
    # below is what meets the archive, and the gate is checked before the lease
    sid = sessions.new()
    tid = start_turn(store, RecordingDispatcher(), sid, "say hi")  # its step is never sent
    assert begin_step(store, tid, lease_ms=120_000)
    archive(
        store, FaultyDispatcher(dispatcher, drop=frozenset({"turn.stop"})), sid, stop_activity=True
    )
    requests = model_requests(store, sid)

    # When a copy of its step reaches the turn workers
    dispatcher.send("turn.step", [sid, tid, 0], "turn")

    # Then the gate refuses it: the turn settles cancelled and no model request is made
    wait_log(worker(fleet, "turn"), f"step 0 of turn {tid} refused by the gate (archived {sid})")
    wait_turn_state(store, tid, "cancelled")
    assert model_requests(store, sid) == requests

    # And a late wake-up of the archived session stores nothing at all
    with pytest.raises(SessionArchived):
        start_turn(store, dispatcher, sid, "say hi", source="reminder")
    assert turn_state(store, tid) == "cancelled"
    assert store.redis.zcard(store.keys.live_turns(sid)) == 0


def test_a_redelivered_step_of_a_completed_turn_is_dropped_without_a_second_request(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn that completed after one model request
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, "say hi")
    wait_turn_state(store, tid, "completed")
    assert requests_of(store, sid, tid) == [0]

    # When its step message is delivered twice more
    dispatcher.send("turn.step", [sid, tid, 0], "turn")
    dispatcher.send("turn.step", [sid, tid, 0], "turn")

    # Then both copies are dropped and no second model request is made
    wait_log(worker(fleet, "turn"), f"step 0 of turn {tid} dropped: completed", count=2)
    assert requests_of(store, sid, tid) == [0]
    assert turn_state(store, tid) == "completed"


def test_a_late_copy_of_an_earlier_step_is_dropped_as_stale(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn whose second step is in a model request (long enough that the copy below
    # arrives while it runs, on a loaded machine too)
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, "say first\nthink 8")
    wait_request(store, sid, tid, 1)

    # When a copy of its first step arrives again
    dispatcher.send("turn.step", [sid, tid, 0], "turn")

    # Then it is dropped as stale, and the turn finishes with one request per step
    wait_log(worker(fleet, "turn"), f"step 0 of turn {tid} dropped: stale")
    wait_turn_state(store, tid, "completed")
    assert requests_of(store, sid, tid) == [0, 1]


def test_a_descendant_created_just_after_its_parents_archive_is_gated(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given an archived parent
    parent = sessions.new()
    archive(store, dispatcher, parent)

    # When a subagent (and its own subagent) is created under it just afterwards
    child = create_session(store, "/tmp", parent_id=parent).session_id
    grandchild = create_session(store, "/tmp", parent_id=child).session_id

    # Then both are born archived, and their first turns, started as a spawn would, are
    # refused: nothing is stored and no model request is made
    assert get_session(store, child).archived and get_session(store, grandchild).archived
    for sid in (child, grandchild):
        with pytest.raises(SessionArchived):
            start_turn(store, dispatcher, sid, "say hi", source="subagent")
        assert store.redis.zcard(store.keys.live_turns(sid)) == 0
        assert model_requests(store, sid) == [] and history(store, sid) == []


def test_a_job_start_that_outlived_the_archive_starts_no_process(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given an archived session
    sid = sessions.new()
    archive(store, dispatcher, sid)

    # When a job start for it reaches a job worker
    jid = new_id("job")
    job_scripts.job_create(
        store,
        job_id=jid,
        session_id=sid,
        label="sleep 68.3s",
        seconds=68.3,
        now_iso=iso(now_ms()),
        start_timeout_ms=30_000,
        guard=None,
        max_live=16,
        command="",
    )
    dispatcher.send("job.run", [sid, jid], "job")

    # Then the worker refuses it and starts no process
    wait_for(lambda: job_record(store, jid)["state"] == "refused", 15, message="job refused")
    # (the log line follows the state write: wait for it rather than read it at once)
    wait_for(
        lambda: any(
            f"job {jid} not started: refused:{sid}" in log_text(w) for w in job_workers(fleet)
        ),
        10,
        message="the refusal in a job worker's log",
    )
    assert job_record(store, jid)["pid"] == ""
    assert not any(sleep_processes(w.process.pid, "68.3") for w in job_workers(fleet))
    assert not census(store, sid)


def test_after_unarchive_nothing_that_was_stopped_restarts(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session whose thinking turn and running job were stopped by its archive
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, "run 69.3\nthink 60")
    wait_request(store, sid, tid, 1)
    jid = item_of(store, sid, "job").id
    pid = wait_job_pid(store, jid)
    archive(store, dispatcher, sid, stop_activity=True)
    wait_drained(store, sid)
    wait_gone(pid)
    requests_before = requests_of(store, sid, tid)

    # When it is unarchived
    assert unarchive(store, sid) == 1

    # Then the session itself runs again: a new prompt makes its model request, and the job
    # it starts runs to its end (the control: turn and job workers took messages sent after
    # the unarchive)
    new = start_turn(store, dispatcher, sid, "run 0.3\nsay back")
    wait_turn_state(store, new, "completed")
    assert requests_of(store, sid, new) == [0, 1]
    wait_drained(store, sid)
    # And nothing that was stopped restarted meanwhile: the old turn stays cancelled with no
    # model request of its own, the old job stays stopped and its process is not run again
    assert turn_state(store, tid) == "cancelled"
    assert requests_of(store, sid, tid) == requests_before
    assert job_record(store, jid)["state"] == "stopped"
    assert not any(sleep_processes(w.process.pid, "69.3") for w in job_workers(fleet))
