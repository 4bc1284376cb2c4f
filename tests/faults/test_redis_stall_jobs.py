"""A Redis stall does not lose running jobs: a job worker (``JobSupervisor``, its watchdog a
real child process, its jobs in their containment) whose private ``redis-server`` is frozen
(SIGSTOP by its PID) for twice the kill margin and past the lapse of the jobs' lease, but
less than ``FLEET_JOB_FREEZE_MAX_SECONDS``, has its job frozen, not killed; when Redis answers
again the job is thawed with its lease taken again and runs on, counted by the census."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.embedded import EmbeddedRedis
from orchestrator import jobs, sessions, watchdogs
from orchestrator.activity import census
from orchestrator.store import Store
from tests.helpers import RecordingDispatcher, wait_for
from tests.workers.support import process_alive

pytestmark = pytest.mark.timeout(90)

LEASE_MS = 3000  # the watchdog's kill margin: 1 s left, 2 s after the last renewal


@pytest.fixture
def store(private_redis: EmbeddedRedis) -> Iterator[Store]:
    s = Store(private_redis.url, "stall:")
    yield s
    s.close()


@pytest.fixture
def supervisor(store: Store) -> Iterator[jobs.JobSupervisor]:
    sup = jobs.JobSupervisor(
        store, "host-stall", lease_ms=LEASE_MS, grace_seconds=1, freeze_max_seconds=60
    )
    yield sup
    sup.shutdown()


def frozen(pid: int, tree: str) -> bool:
    """Whether the job's tree is frozen: its cgroup says ``frozen 1``, or (no cgroup) its
    process is stopped (``T`` in ``/proc/<pid>/stat``). Asserts the process is alive."""
    assert process_alive(pid), "the job's process died"
    if tree.startswith("/"):
        return "frozen 1" in (Path(tree) / "cgroup.events").read_text()
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def pttl_calls(store: Store) -> int:
    """How many ``PTTL`` commands the server ran (the watchdogs' reads of a lease)."""
    return int(store.redis.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0))


def counted(store: Store, sid: str, jid: str) -> bool:
    return any(item.id == jid for item in census(store, sid))


def test_a_job_survives_a_redis_stall_frozen_and_runs_on_with_its_lease_taken_again(
    private_redis: EmbeddedRedis, store: Store, supervisor: jobs.JobSupervisor
) -> None:
    redis_pid = private_redis.pid
    assert redis_pid is not None
    # Given a running job, counted by the census
    sid = sessions.create_session(store, "/tmp/redis-stall").session_id
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
    assert supervisor.start(sid, jid) == "running"
    pid = supervisor.pids()[jid]
    tree = store.redis.hget(store.keys.job(jid), "tree") or ""  # recorded before the start
    assert counted(store, sid, jid)
    # ... which its watchdog has read (two of its reads of a lease since the job's record)
    seen = pttl_calls(store)
    wait_for(lambda: pttl_calls(store) >= seen + 2, 10, message="the watchdog's reads")
    margin = watchdogs.kill_margin(LEASE_MS)
    os.kill(redis_pid, signal.SIGSTOP)
    stalled = time.monotonic()
    try:
        # When Redis stalls for twice the kill margin's time and past the lease's lapse
        wait_for(lambda: frozen(pid, tree), LEASE_MS / 1000 + 5, message="the job frozen")
        until = stalled + max(2 * (LEASE_MS / 1000 - margin), LEASE_MS / 1000 + 1)
        while time.monotonic() < until:
            # Then the job is frozen meanwhile, not killed
            assert frozen(pid, tree)
            time.sleep(0.1)
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    # And once Redis answers, it is thawed, its lease taken again, counted, and runs on
    wait_for(lambda: not frozen(pid, tree), 15, message="the job thawed")
    assert store.redis.hget(store.keys.job(jid), "state") == "running"
    assert counted(store, sid, jid)
    renewed_until = time.monotonic() + 2 * LEASE_MS / 1000
    while time.monotonic() < renewed_until:
        assert not frozen(pid, tree)
        assert store.redis.pttl(store.keys.job_lease(jid)) > 0
        time.sleep(0.2)
    assert counted(store, sid, jid)
    assert store.redis.hget(store.keys.job(jid), "state") == "running"
