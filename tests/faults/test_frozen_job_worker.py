"""A frozen job worker (SIGSTOP by PID) does not hide running work: its jobs die before their
leases lapse (the worker's watchdog, ``orchestrator/job/jobwatch.py``), so when the census stops
counting a job, a plain archive records the session quiet over no running process, and the
worker, once resumed, revives nothing and keeps working.

A fleet of this module's own (prefix ``frozenjob:``) with a 2 s job lease."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.process.ownership import is_process
from orchestrator.session.sessions import create_session, get_session
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import wait_for
from tests.workers.support import job_record, process_alive, wait_gone, wait_job_pid

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = {"FLEET_JOB_LEASE_SECONDS": "2"}
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "frozenjob", [Family.JOB], env
    ) as fleet:
        yield fleet


def counted(private: PrivateFleet, sid: str, jid: str) -> bool:
    return any(item.id == jid for item in census(private.store, sid))


def test_a_frozen_job_workers_job_is_dead_once_it_no_longer_counts_and_stays_dead_on_thaw(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given a session owning a running 300 s job
    sid = create_session(store, "/tmp/frozen").session_id
    jid = jobs.create_job(store, dispatcher, sid, 300, "sleep 300")
    pid = wait_job_pid(store, jid)
    started = job_record(store, jid)["pidStart"]
    assert counted(private, sid, jid)

    # When its job worker is frozen (SIGSTOP by PID; its children are not)
    private.signal(Family.JOB, signal.SIGSTOP)
    try:
        # ... until the census no longer counts the job
        wait_for(lambda: not counted(private, sid, jid), 15, message="the job to stop counting")
        # Then its process is already dead (at most a zombie its frozen parent cannot reap)
        assert not process_alive(pid)
        assert job_record(store, jid)["state"] == "lost"
        # And a plain archive succeeds, stops nothing and records the session quiet
        result = archive(store, dispatcher, sid)
        assert (result.outcome, result.stopped) == ("archived", [])
        assert get_session(store, sid).quiet_at is not None
    finally:
        # When the worker resumes
        private.signal(Family.JOB, signal.SIGCONT)

    # Then no process of the job exists (the zombie is reaped), and the job stays lost
    wait_for(lambda: not is_process(pid, started), 15, message="the job's zombie to be reaped")
    assert job_record(store, jid)["state"] == "lost"
    assert not store.redis.exists(store.keys.job_lease(jid))

    # And the worker keeps working: a new job starts, counts, and is stopped by an archive
    sid2 = create_session(store, "/tmp/frozen").session_id
    jid2 = jobs.create_job(store, dispatcher, sid2, 300, "sleep 300 again")
    pid2 = wait_job_pid(store, jid2)
    assert counted(private, sid2, jid2)
    result = archive(store, dispatcher, sid2, stop_activity=True)
    assert [item.id for item in result.stopped] == [jid2]
    wait_gone(pid2, 15)
    wait_for(lambda: job_record(store, jid2)["state"] == "stopped", 15, message="job stopped")
