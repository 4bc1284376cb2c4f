"""A job host stops the jobs of an archived session by itself (``JobSupervisor``,
``orchestrator/job/jobgatewatch.py``): it hears the gate's closure the archive script announces
(``gate.listen``) and asks the gate, so a job ends although its ``job.stop`` request is never
delivered. Run in-process with a real ``JobSupervisor`` (real ``sleep`` processes) against
real Redis; the dispatcher records the stop requests and delivers none. A closure missed while
Redis was away: ``tests/faults/test_job_gate_watch_restart.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from orchestrator.archiving import archive
from orchestrator.census.activity import census
from orchestrator.job import jobs
from orchestrator.job.jobs import JobState
from orchestrator.job.jobsupervisor import JobSupervisor
from orchestrator.session import gate, sessions
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, wait_for
from tests.workers.support import process_alive

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def supervisor(store: Store) -> Iterator[JobSupervisor]:
    sup = JobSupervisor(store, "host-gate-watch", lease_ms=10_000, grace_seconds=1)
    yield sup
    sup.shutdown()


def running_job(store: Store, sup: JobSupervisor, sid: str) -> tuple[str, int]:
    """A job of ``sid`` running under ``sup``: ``(job id, pid)``."""
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
    assert sup.start(sid, jid) == "running"
    return jid, sup.pids()[jid]


def state(store: Store, jid: str) -> str | None:
    found: str | None = store.redis.hget(store.keys.job(jid), "state")
    return found


def test_an_archived_sessions_job_ends_although_its_stop_request_is_never_delivered(
    store: Store, cwd: str, supervisor: JobSupervisor
) -> None:
    # Given a session whose job runs here, and another session whose job runs here too
    sid = sessions.create_session(store, cwd).session_id
    other = sessions.create_session(store, cwd).session_id
    jid, pid = running_job(store, supervisor, sid)
    other_jid, other_pid = running_job(store, supervisor, other)
    # When the first is archived with stopActivity, its stop requests recorded, none delivered
    sent = RecordingDispatcher()
    archive.archive(store, sent, sid, stop_activity=True)
    assert [(task, args) for task, args, _ in sent.sent if task == "job.stop"] == [
        ("job.stop", [sid, [jid]])
    ]
    # Then this host stops its job (SIGTERM to the real process) and records it stopped
    wait_for(lambda: not process_alive(pid), 10, message="the archived session's job to end")
    wait_for(lambda: state(store, jid) == JobState.STOPPED, 10, message="the job stopped")
    assert census(store, sid) == []
    # And the archive is recorded quiet by the same host, with no stop task run
    wait_for(
        lambda: store.redis.hget(store.keys.session(sid), "quietAt"),
        10,
        message="the archive recorded quiet",
    )
    # And the other session's job runs on
    assert process_alive(other_pid)
    assert state(store, other_jid) == JobState.RUNNING
    assert jid not in supervisor.owned()


def test_a_subagents_job_ends_when_its_parent_is_archived(
    store: Store, cwd: str, supervisor: JobSupervisor
) -> None:
    # Given a job of a subagent
    parent = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent_id=parent).session_id
    jid, pid = running_job(store, supervisor, child)
    # When the parent is archived with stopActivity (no stop request delivered)
    archive.archive(store, RecordingDispatcher(), parent, stop_activity=True)
    # Then the subagent's job ends here
    wait_for(lambda: not process_alive(pid), 10, message="the subagent's job to end")
    wait_for(lambda: state(store, jid) == JobState.STOPPED, 10, message="the job stopped")


def test_a_closure_heard_late_spares_a_job_started_after_the_unarchive(
    store: Store, cwd: str, supervisor: JobSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a host whose hearing of the next archive of `sid` is held back until the test
    # lets it go (the process's closure feed reads it, then waits)
    sid = sessions.create_session(store, cwd).session_id
    held, release = threading.Event(), threading.Event()
    parse = gate._closed_ids

    def late(data: object) -> frozenset[str] | None:
        closed = parse(data)
        if closed and sid in closed:
            held.set()
            release.wait(20)
        return closed

    monkeypatch.setattr(gate, "_closed_ids", late)
    keep_busy = sessions.create_session(store, cwd).session_id
    busy_jid, _ = running_job(store, supervisor, keep_busy)
    subscribed = gate.listening(store)
    assert subscribed is not None and subscribed.wait(10), "no subscription to closures"
    # When the idle session is archived, then unarchived, then starts a job here, all before
    # the host hears that archive
    archive.archive(store, RecordingDispatcher(), sid)
    assert held.wait(10), "the feed never read the archive"
    archive.unarchive(store, sid)
    jid, pid = running_job(store, supervisor, sid)
    release.set()
    # Then the late closure stops nothing: the gate admits the session now
    archive.archive(store, RecordingDispatcher(), keep_busy, stop_activity=True)
    wait_for(
        lambda: state(store, busy_jid) == JobState.STOPPED,
        10,
        message="the next archive to be acted on (the late one was heard before it)",
    )
    assert process_alive(pid)
    assert state(store, jid) == JobState.RUNNING


def test_a_supervisor_whose_thread_runs_before_its_constructor_returns_still_forks_jobs(
    store: Store, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the worst scheduling for a new supervisor: its thread runs for a while before the
    # constructor goes on past starting it
    class EagerThread(threading.Thread):
        def start(self) -> None:
            super().start()
            if self.name == "job-supervisor":
                time.sleep(0.3)

    monkeypatch.setattr(threading, "Thread", EagerThread)
    sup = JobSupervisor(store, "host-eager", lease_ms=10_000, grace_seconds=1)
    monkeypatch.undo()
    try:
        # Then its thread is alive, and a job it takes gets its process
        assert sup._thread.is_alive()
        sid = sessions.create_session(store, cwd).session_id
        jid, pid = running_job(store, sup, sid)
        assert process_alive(pid)
    finally:
        sup.shutdown()
