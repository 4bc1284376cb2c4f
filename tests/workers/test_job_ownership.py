"""A stop kills only our own process: a job is identified by the worker instance that claimed
it and by its process's start time, both verified before anything is signalled, and one host
name has one live job worker (``orchestrator/process/ownership.py``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from orchestrator.archiving.archive import archive
from orchestrator.families import Family
from orchestrator.job import scripts as job_scripts
from orchestrator.storage.store import iso, new_id
from tests.helpers import wait_for
from tests.workers.support import job_record, process_alive, wait_gone, wait_log, worker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def unrelated_sleep() -> Iterator[subprocess.Popen[bytes]]:
    """A process that has nothing to do with any job (its own process group, as a job's
    would be), killed at teardown."""
    proc = subprocess.Popen(["sleep", "71.7"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait(5)


def orphan_record(store: Any, sid: str, host: str, pid: int, pid_start: float) -> str:
    """A job recorded running on ``host`` by a worker instance that no longer exists, with
    ``pid`` and ``pid_start`` as its process. Returns the job id."""
    jid = new_id("job")
    now = iso(store.now_ms())
    job_scripts.job_create(
        store,
        job_id=jid,
        session_id=sid,
        label="sleep 71.7s",
        seconds=71.7,
        now_iso=now,
        start_timeout_ms=60_000,
        guard=None,
        max_live=16,
        command="",
    )
    instance = f"{host}/gone0gone0gon"
    claimed = job_scripts.job_claim(
        store,
        job_id=jid,
        host=host,
        lease_ms=60_000,
        now_iso=now,
        instance=instance,
        max_per_host=64,
        limit_template="limit (%d)",
    )
    assert claimed == "ok"
    store.redis.hset(store.keys.job(jid), mapping={"pid": pid, "pidStart": repr(pid_start)})
    return jid


def test_a_stop_never_kills_a_process_whose_start_time_is_not_the_jobs(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any, unrelated_sleep: Any
) -> None:
    # Given a job left running by an earlier worker of host test-1 whose recorded pid is now
    # an unrelated live process (same pid, another start time: a reused pid, or the same pid
    # in another pid namespace)
    host = fleet.job_host_names()[0]
    sid = sessions.new()
    pid = unrelated_sleep.pid
    started = psutil.Process(pid).create_time()
    jid = orphan_record(store, sid, host, pid, started - 100)

    # When the session is archived with its work stopped (the stop goes to test-1)
    archive(store, dispatcher, sid, stop_activity=True)

    # Then the job is recorded lost and nothing was signalled: the unrelated process lives
    wait_for(lambda: job_record(store, jid)["state"] == "lost", 15, message="job lost")
    wait_log(worker(fleet, "job", host), f"job {jid}: recorded lost, nothing signalled")
    assert process_alive(pid)
    assert unrelated_sleep.poll() is None


def test_an_orphan_whose_pid_and_start_time_match_is_killed(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any, unrelated_sleep: Any
) -> None:
    # Given a job left running by an earlier worker of host test-1 whose process (pid and
    # start time) still runs
    host = fleet.job_host_names()[0]
    sid = sessions.new()
    pid = unrelated_sleep.pid
    jid = orphan_record(store, sid, host, pid, psutil.Process(pid).create_time())

    # When the session is archived with its work stopped
    archive(store, dispatcher, sid, stop_activity=True)

    # Then that process is killed and the job is recorded stopped
    wait_gone(pid)
    wait_for(lambda: job_record(store, jid)["state"] == "stopped", 15, message="job stopped")


def test_a_second_job_worker_with_a_held_host_name_exits_naming_the_holder(
    fleet: Any, store: Any
) -> None:
    # Given the live job worker of host test-1, which holds its host name
    host = fleet.job_host_names()[0]
    holder = store.redis.hgetall(store.keys.job_host(host))
    assert holder["pid"] == str(worker(fleet, "job", host).process.pid)

    # When a second `fleet worker --family job --host test-1` starts
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "worker", "--family", "job", "--host", host],
        env=fleet.env(host, Family.JOB),
        capture_output=True,
        text=True,
        timeout=45,
    )

    # Then it exits non-zero with an error naming the holder (instance id, pid, since)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"Host name {host!r} is held by the live job worker {holder['instance']}" in proc.stderr
    assert f"(pid {holder['pid']}, since {holder['since']})" in proc.stderr
    # And the holder still holds it and still runs
    assert store.redis.hget(store.keys.job_host(host), "instance") == holder["instance"]
    assert worker(fleet, "job", host).process.poll() is None
