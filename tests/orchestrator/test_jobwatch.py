"""The job watchdog's pass (``orchestrator/jobwatch.py``) against real Redis and real
processes, run in-process: it kills a job's verified process group before its lease lapses
and never signals a process it cannot verify."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from orchestrator import jobs, sessions
from orchestrator.activity import census
from orchestrator.jobwatch import REASON, Watchdog
from orchestrator.jobs import JobState
from orchestrator.ownership import process_start
from orchestrator.processes import die_with_parent
from orchestrator.store import Store
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import claim_job

INSTANCE = "hostA/test"  # claim_job's instance


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
    yield proc
    proc.kill()
    proc.wait(5)


def running_job(store: Store, cwd: str, proc: subprocess.Popen[bytes], started: object) -> str:
    sid = sessions.create_session(store, cwd).session_id
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
    claim_job(store, jid, "hostA")
    store.redis.hset(store.keys.job(jid), mapping={"pid": proc.pid, "pidStart": repr(started)})
    return jid


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
