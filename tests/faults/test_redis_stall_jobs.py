"""A Redis stall does not lose running jobs: a job worker (``JobSupervisor``, its watchdog a
real child process, its jobs in their containment) whose private ``redis-server`` is frozen
(SIGSTOP by its PID) for twice the kill margin and past the lapse of the jobs' lease, but
less than ``FLEET_JOB_FREEZE_MAX_SECONDS``, has its job frozen, not killed; when Redis answers
again the job is thawed with its lease taken again and runs on, counted by the census."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localfleet.embedded import EmbeddedRedis
from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.job import jobs
from orchestrator.job.jobsupervisor import JobSupervisor
from orchestrator.process import watchdogs
from orchestrator.session import sessions
from orchestrator.storage.store import Store
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
def freeze_max() -> float:
    """The supervisor's ``FLEET_JOB_FREEZE_MAX_SECONDS`` (a test may override it)."""
    return 60


@pytest.fixture
def supervisor(store: Store, freeze_max: float) -> Iterator[JobSupervisor]:
    sup = JobSupervisor(
        store, "host-stall", lease_ms=LEASE_MS, grace_seconds=1, freeze_max_seconds=freeze_max
    )
    yield sup
    sup.shutdown()


@pytest.fixture
def redis_pid(private_redis: EmbeddedRedis) -> Iterator[int]:
    """The private Redis's PID; resumed (SIGCONT) after the test whatever it did."""
    pid = private_redis.pid
    assert pid is not None
    yield pid
    os.kill(pid, signal.SIGCONT)


def watched_job(store: Store, sup: JobSupervisor) -> tuple[str, str, int, str]:
    """A new session's running job under ``sup``, counted and read by its watchdog (two of
    its reads of a lease since the job's record): ``(sid, jid, pid, tree handle)``."""
    sid = sessions.create_session(store, "/tmp/redis-stall").session_id
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
    assert sup.start(sid, jid) == "running"
    pid = sup.pids()[jid]
    tree = store.redis.hget(store.keys.job(jid), "tree") or ""  # recorded before the start
    assert counted(store, sid, jid)
    seen = pttl_calls(store)
    wait_for(lambda: pttl_calls(store) >= seen + 2, 10, message="the watchdog's reads")
    return sid, jid, pid, tree


def frozen(pid: int, tree: str) -> bool:
    """Whether the job's tree is frozen: its cgroup says ``frozen 1``, or (no cgroup) its
    process is stopped (``T`` in ``/proc/<pid>/stat``). Asserts the process is alive."""
    assert process_alive(pid), "the job's process died"
    if tree.startswith("/"):
        return "frozen 1" in (Path(tree) / "cgroup.events").read_text()
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def thawed(pid: int, tree: str) -> bool:
    """Whether the job's tree was asked to run again: its cgroup's ``cgroup.freeze`` reads 0
    (``cgroup.events`` may say ``frozen 0`` of a frozen tree being killed), or (no cgroup) its
    process is neither stopped nor dying. Raises ``OSError`` once its cgroup is removed."""
    if tree.startswith("/"):
        return (Path(tree) / "cgroup.freeze").read_text().strip() == "0"
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] not in ("T", "Z", "X")


def pttl_calls(store: Store) -> int:
    """How many ``PTTL`` commands the server ran (the watchdogs' reads of a lease)."""
    return int(store.redis.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0))


def counted(store: Store, sid: str, jid: str) -> bool:
    return any(item.id == jid for item in census(store, sid))


def frozen_past_its_lapse(redis_pid: int, pid: int, tree: str) -> float:
    """Stall Redis (SIGSTOP by PID) until the job is frozen and its lease lapsed in the
    server (Redis stays stopped). Returns the monotonic time the stall began."""
    os.kill(redis_pid, signal.SIGSTOP)
    stalled = time.monotonic()
    wait_for(lambda: frozen(pid, tree), LEASE_MS / 1000 + 5, message="the job frozen")
    while time.monotonic() < stalled + LEASE_MS / 1000 + 0.5:
        time.sleep(0.1)
    return stalled


def test_a_job_survives_a_redis_stall_frozen_and_runs_on_with_its_lease_taken_again(
    redis_pid: int, store: Store, supervisor: JobSupervisor
) -> None:
    # Given a running job, counted by the census and read by its watchdog
    sid, jid, pid, tree = watched_job(store, supervisor)
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


def test_a_frozen_job_whose_session_is_archived_as_redis_returns_dies_never_thawed(
    redis_pid: int, store: Store, supervisor: JobSupervisor
) -> None:
    # Given a running job frozen through a Redis stall until its lease lapsed
    sid, jid, pid, tree = watched_job(store, supervisor)
    frozen_past_its_lapse(redis_pid, pid, tree)
    # ... its watchdog held (SIGSTOP by PID) so that the archive comes before its next pass
    watchdog = supervisor._watchdog
    assert watchdog is not None
    os.kill(watchdog.pid, signal.SIGSTOP)
    try:
        # When Redis answers again and the session is archived
        os.kill(redis_pid, signal.SIGCONT)
        assert archive(store, RecordingDispatcher(), sid).outcome == "archived"
        archived = time.monotonic()
    finally:
        os.kill(watchdog.pid, signal.SIGCONT)
    # Then the job dies within 5 s of the archive, and is never seen thawed meanwhile
    while process_alive(pid):
        assert time.monotonic() - archived < 5, "the job outlived its archive by 5 s"
        with contextlib.suppress(OSError):  # its cgroup is removed as it dies
            assert not thawed(pid, tree), "thawed after its archive"
        time.sleep(0.02)
    wait_for(lambda: not counted(store, sid, jid), 10, message="the job no longer counted")
    assert store.redis.hget(store.keys.job(jid), "state") in ("lost", "stopped")


@pytest.mark.parametrize("freeze_max", [2.0])
def test_a_job_frozen_longer_than_the_freeze_bound_is_killed_and_counted_lost(
    redis_pid: int, store: Store, supervisor: JobSupervisor
) -> None:
    # Given a running job, its worker's watchdog freezing a job for at most 2 s
    sid, jid, pid, tree = watched_job(store, supervisor)
    # When Redis stalls beyond it
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        wait_for(lambda: frozen(pid, tree), LEASE_MS / 1000 + 5, message="the job frozen")
        frozen_seen = time.monotonic()
        # Then the job is killed, frozen, during the stall once frozen for the bound
        wait_for(lambda: not process_alive(pid), 10, message="the frozen job killed")
        assert time.monotonic() - frozen_seen > 1
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    # And once Redis answers, it no longer counts and is recorded lost
    wait_for(lambda: not counted(store, sid, jid), 10, message="the job no longer counted")
    wait_for(
        lambda: store.redis.hget(store.keys.job(jid), "state") == "lost",
        10,
        message="the job recorded lost",
    )


def test_a_frozen_job_whose_watchdog_died_is_killed_by_its_worker_once_redis_answers(
    redis_pid: int, store: Store, supervisor: JobSupervisor
) -> None:
    # Given a running job frozen through a Redis stall until its lease lapsed
    sid, jid, pid, tree = watched_job(store, supervisor)
    try:
        stalled = frozen_past_its_lapse(redis_pid, pid, tree)
        # ... whose watchdog then dies (SIGKILL by PID)
        watchdog = supervisor._watchdog
        assert watchdog is not None
        watchdog.kill()
        watchdog.wait(5)
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    # When Redis answers again, its worker's renewal is refused (the lease lapsed)
    # Then the worker kills the frozen job, never thawed, and it is recorded lost
    while process_alive(pid):
        assert time.monotonic() - stalled < LEASE_MS / 1000 + 15, "the frozen job lived on"
        with contextlib.suppress(OSError):  # its cgroup is removed as it dies
            assert not thawed(pid, tree), "thawed with nobody to settle it"
        time.sleep(0.02)
    wait_for(
        lambda: store.redis.hget(store.keys.job(jid), "state") == "lost",
        10,
        message="the job recorded lost",
    )
    assert not counted(store, sid, jid)
