"""The job watchdog's pass (``orchestrator/job/jobwatch.py``) against real Redis and real
processes, run in-process: it kills a job's verified process group before its lease lapses
and never signals a process it cannot verify."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from orchestrator.census.activity import census
from orchestrator.job import jobs, jobwatch
from orchestrator.job.jobs import JobState
from orchestrator.job.jobsupervisor import JobSupervisor
from orchestrator.job.jobwatch import REASON, Watchdog
from orchestrator.process.ownership import process_start
from orchestrator.process.processes import die_with_parent
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import running_job
from tests.workers.support import process_alive

INSTANCE = "hostA/test"  # claim_job's instance


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
    yield proc
    proc.kill()
    proc.wait(5)


def test_a_job_whose_lease_runs_low_is_killed_then_recorded_lost_before_the_lease_lapses(
    store: Store, cwd: str, sleeper: subprocess.Popen[bytes]
) -> None:
    # Given a running job of this instance with a healthy lease, watched with a 3 s lease
    jid = running_job(store, cwd, sleeper, process_start(sleeper.pid))
    watchdog = Watchdog(store, "hostA", INSTANCE, 3000)
    store.redis.pexpire(store.keys.job_lease(jid), 3000)
    # When it polls: nothing is killed
    assert watchdog.poll() == []
    assert sleeper.poll() is None
    # When less than a third of the lease is left (nobody renewed it)
    store.redis.pexpire(store.keys.job_lease(jid), 500)
    # Then the next pass kills its process group and records it lost with the reason
    assert watchdog.poll() == [jid]
    assert sleeper.wait(5) == -9
    record = store.redis.hgetall(store.keys.job(jid))
    assert (record["state"], record["reason"]) == (JobState.LOST, REASON)
    assert census(store, record["sessionId"]) == []


def test_a_watched_job_the_census_counted_lost_is_killed_if_its_process_still_runs(
    store: Store, cwd: str, sleeper: subprocess.Popen[bytes]
) -> None:
    # Given a watched running job (a whole host was frozen: the lease lapsed meanwhile)
    jid = running_job(store, cwd, sleeper, process_start(sleeper.pid))
    watchdog = Watchdog(store, "hostA", INSTANCE, 3000)
    assert watchdog.poll() == []
    # When the census marks it lost before the watchdog runs again
    store.redis.delete(store.keys.job_lease(jid))
    census(store, store.redis.hget(store.keys.job(jid), "sessionId"))
    # Then the watchdog's next pass kills its process
    assert watchdog.poll() == [jid]
    assert sleeper.wait(5) == -9


def test_a_job_killed_only_after_its_lease_lapsed_says_so_not_that_it_was_in_time(
    store: Store, cwd: str, sleeper: subprocess.Popen[bytes]
) -> None:
    # Given a watched job whose lease the watchdog last read with 0.2 s left
    jid = running_job(store, cwd, sleeper, process_start(sleeper.pid))
    watchdog = Watchdog(store, "hostA", INSTANCE, 3000)
    store.redis.pexpire(store.keys.job_lease(jid), 60_000)
    assert watchdog.poll() == []
    store.redis.pexpire(store.keys.job_lease(jid), 200)
    watchdog._learn(jobwatch._read(store, "hostA", [jid]), time.monotonic())
    # When the watchdog itself is held up past that lapse (frozen with its worker)
    time.sleep(0.5)
    # Then its next pass kills the job and records how late it was, not "before it lapsed"
    assert watchdog.poll() == [jid]
    assert sleeper.wait(5) == -9
    reason = store.redis.hget(store.keys.job(jid), "reason")
    assert reason is not None and reason != REASON and "after the lease lapsed" in reason


def test_a_pid_that_did_not_start_when_the_job_did_is_never_signalled(
    store: Store, cwd: str, sleeper: subprocess.Popen[bytes]
) -> None:
    # Given a running job whose recorded pid names a process that started at another time
    jid = running_job(store, cwd, sleeper, (process_start(sleeper.pid) or 0) - 100)
    watchdog = Watchdog(store, "hostA", INSTANCE, 3000)
    # When its lease runs low
    store.redis.pexpire(store.keys.job_lease(jid), 100)
    # Then nothing is signalled: that process is not the job's
    assert watchdog.poll() == []
    assert sleeper.poll() is None


def test_jobs_of_another_worker_instance_are_not_watched(
    store: Store, cwd: str, sleeper: subprocess.Popen[bytes]
) -> None:
    jid = running_job(store, cwd, sleeper, process_start(sleeper.pid))
    store.redis.pexpire(store.keys.job_lease(jid), 100)
    assert Watchdog(store, "hostA", "hostA/another", 3000).poll() == []
    assert sleeper.poll() is None


def test_a_supervisor_that_may_not_renew_a_jobs_lease_kills_it_and_stops_tracking_it(
    store: Store, cwd: str
) -> None:
    # Given a supervisor running a job, its watchdog frozen (SIGSTOP by PID)
    sup = JobSupervisor(store, "hostW", lease_ms=2000, grace_seconds=1)
    try:
        wait_for(lambda: sup._watchdog is not None, 10, message="the watchdog to start")
        assert sup._watchdog is not None
        os.kill(sup._watchdog.pid, signal.SIGSTOP)
        sid = sessions.create_session(store, cwd).session_id
        jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
        assert sup.start(sid, jid) == "running"
        pid = sup.pids()[jid]
        # When its lease lapses (as over a freeze of the supervisor) and the census marks it lost
        store.redis.delete(store.keys.job_lease(jid))
        assert census(store, sid) == []
        # Then the supervisor's next renewal is refused: it kills the process, stops tracking
        wait_for(lambda: jid not in sup.owned(), 10, message="the job to be dropped")
        wait_for(lambda: not process_alive(pid), 10, message="the job's process to die")
        # And the job stays lost (the census's record), its lease never revived
        assert store.redis.hget(store.keys.job(jid), "state") == JobState.LOST
        assert not store.redis.exists(store.keys.job_lease(jid))
    finally:
        if sup._watchdog is not None:
            os.kill(sup._watchdog.pid, signal.SIGCONT)
        sup.shutdown()
