"""The watchdogs with their Redis frozen: the reads they cannot make must not hold up their
decisions. A shell command (the exec warden, ``orchestrator/process/execwatch.py``) whose lease was
last read is killed by that reading's lapse time, before the lease lapses in the server,
while the server answers nothing (SIGSTOP of a private ``redis-server`` by its PID). A job
(the job watchdog, ``orchestrator/job/jobwatch.py``) is frozen by that time instead (killed with
``FLEET_JOB_FREEZE_MAX_SECONDS=0``), resumed when Redis answers again and the job may still
run, killed frozen when its session was archived meanwhile or when the stall outlasts the
freeze bound."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from localfleet.embedded import EmbeddedRedis
from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.job import jobwatch
from orchestrator.process import watchdogs
from orchestrator.process.execwatch import Warden
from orchestrator.process.ownership import process_start
from orchestrator.process.processes import die_with_parent
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import running_job

LEASE_MS = 6000  # killed with a third (2 s) left; polled every 0.75 s


class Victim:
    """A process in a group of its own (as a command under ``timeout``, as a job), and the
    monotonic time it died, noted by a thread of its own (the watchdog's record of a kill
    may wait on the frozen Redis)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
        self.died: float | None = None
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.died = time.monotonic()

    def killed_within(self, since: float, seconds: float) -> float:
        """Seconds from ``since`` to its SIGKILL death, asserted to be under ``seconds``."""
        self._waiter.join(seconds + 10)
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode
        assert self.died is not None
        took = self.died - since
        assert took < seconds, f"killed {took:.2f} s after the lease was set"
        return took


@pytest.fixture
def victim() -> Iterator[Victim]:
    made = Victim()
    yield made
    if made.proc.poll() is None:
        made.proc.kill()
        made.proc.wait(5)


@pytest.fixture
def freeze(private_redis: EmbeddedRedis) -> Iterator[Callable[[], None]]:
    """Freezes the private Redis (SIGSTOP by its PID); thawed after the test."""
    pid = private_redis.pid
    assert pid is not None
    frozen: list[int] = []

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)

    yield stop
    for p in frozen:
        os.kill(p, signal.SIGCONT)


def test_a_watched_command_dies_before_its_lease_lapses_while_redis_is_frozen(
    private_redis: EmbeddedRedis, victim: Victim, freeze: Callable[[], None]
) -> None:
    store = Store(private_redis.url, "frozen-redis:")
    warden = Warden(store)
    try:
        # Given a command whose step lease (6 s) the warden has read once
        store.redis.set(store.keys.step_lease("turn-f"), "tok", px=LEASE_MS)
        leased = time.monotonic()
        assert warden.watch("turn-f", "tok", LEASE_MS, victim.proc.pid) is not None
        wait_for(
            lambda: int(store.redis.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0)),
            30,
            message="the warden's first read of the lease",
        )
        # When Redis is frozen: no read answers, and nobody renews
        freeze()
        # Then the command is killed before the lease would lapse in the server
        victim.killed_within(leased, LEASE_MS / 1000)
    finally:
        warden.close()
        store.close()


@pytest.fixture
def watchdog_store(private_redis: EmbeddedRedis) -> Iterator[Store]:
    """The watchdog's store as its process makes it (``watchdogs.own_store``:
    ``READ_TIMEOUT``)."""
    timeout = watchdogs.READ_TIMEOUT
    store = Store(
        private_redis.url, "frozen-redis:", socket_timeout=timeout, connect_timeout=timeout
    )
    yield store
    store.close()


def proc_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` (``T``: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def leased_job(store: Store, victim: Victim) -> tuple[str, float]:
    """A running job of instance ``hostA/test`` whose process is ``victim``, its lease
    ``LEASE_MS`` from now: ``(job id, monotonic time leased)``."""
    started = process_start(victim.proc.pid)
    jid = running_job(store, "/tmp/frozen-redis", victim.proc, started)
    store.redis.pexpire(store.keys.job_lease(jid), LEASE_MS)
    return jid, time.monotonic()


def poll_until(watchdog: jobwatch.Watchdog, done: Callable[[], bool], seconds: float) -> None:
    """Poll as the watchdog's process does until ``done()``, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "not done in time"
        watchdog.poll()
        time.sleep(watchdog.interval)


def test_unfreezing_watchdog_kills_a_job_before_its_lease_lapses_while_redis_is_frozen(
    watchdog_store: Store, victim: Victim, freeze: Callable[[], None]
) -> None:
    store = watchdog_store
    # Given a running job of this instance whose 6 s lease the watchdog (freezing no
    # job: FLEET_JOB_FREEZE_MAX_SECONDS=0) has read once
    jid, leased = leased_job(store, victim)
    watchdog = jobwatch.Watchdog(store, "hostA", "hostA/test", LEASE_MS, freeze_max=0)
    assert watchdog.poll() == []
    # When Redis is frozen, and the watchdog polls as it runs
    freeze()
    while not watchdog.poll():
        assert time.monotonic() - leased < LEASE_MS / 1000 + 10, "never killed"
        time.sleep(watchdog.interval)
    # Then the job is killed before the lease would lapse in the server
    victim.killed_within(leased, LEASE_MS / 1000)


class Stalled:
    """A running job (``victim``) of a session, its watchdog (freezing a job ``freeze_max``
    seconds at most), and Redis frozen once the watchdog read the job's 6 s lease, the
    watchdog polling as it runs until the job is frozen (``freeze_job``)."""

    def __init__(self, store: Store, victim: Victim, freeze_max: float) -> None:
        self.store = store
        self.pid = victim.proc.pid
        self.jid, self.leased = leased_job(store, victim)
        self.sid = store.redis.hget(store.keys.job(self.jid), "sessionId")
        self.watchdog = jobwatch.Watchdog(
            store, "hostA", "hostA/test", LEASE_MS, freeze_max=freeze_max
        )
        assert self.watchdog.poll() == []

    def freeze_job(self, freeze: Callable[[], None]) -> None:
        freeze()
        poll_until(self.watchdog, lambda: proc_state(self.pid) == "T", LEASE_MS / 1000 + 5)


def test_a_watched_job_is_frozen_while_redis_is_and_resumed_with_its_lease_taken_again(
    private_redis: EmbeddedRedis,
    watchdog_store: Store,
    victim: Victim,
    freeze: Callable[[], None],
) -> None:
    store = watchdog_store
    # Given a running job whose 6 s lease the watchdog has read once
    stalled = Stalled(store, victim, freeze_max=60)
    # When Redis is frozen (nobody renews), the watchdog polling as it runs
    stalled.freeze_job(freeze)
    # Then the job is frozen (not killed) before its lease would lapse in the server
    assert time.monotonic() - stalled.leased < LEASE_MS / 1000
    # ... and stays frozen, while Redis still does not answer, past the lapse of its lease
    while time.monotonic() - stalled.leased < LEASE_MS / 1000 + 1:
        assert stalled.watchdog.poll() == []
        assert proc_state(stalled.pid) == "T"
        time.sleep(stalled.watchdog.interval)
    # When Redis answers again
    assert private_redis.pid is not None
    os.kill(private_redis.pid, signal.SIGCONT)
    # Then the job's lease is taken again and its process thawed: it runs on, counted
    poll_until(stalled.watchdog, lambda: proc_state(stalled.pid) != "T", 10)
    assert victim.proc.poll() is None
    assert store.redis.pttl(store.keys.job_lease(stalled.jid)) > 0
    assert store.redis.hget(store.keys.job(stalled.jid), "state") == "running"
    assert any(item.id == stalled.jid for item in census(store, stalled.sid))


def test_a_frozen_job_whose_session_is_archived_before_it_resumes_is_killed_never_thawed(
    private_redis: EmbeddedRedis,
    watchdog_store: Store,
    victim: Victim,
    freeze: Callable[[], None],
) -> None:
    store = watchdog_store
    # Given a running job frozen by its watchdog while Redis does not answer, until its lease
    # lapsed in the server
    stalled = Stalled(store, victim, freeze_max=60)
    stalled.freeze_job(freeze)
    while time.monotonic() - stalled.leased < LEASE_MS / 1000 + 0.5:
        time.sleep(0.1)
    # When Redis answers again and the session's archive comes before the watchdog's pass
    assert private_redis.pid is not None
    os.kill(private_redis.pid, signal.SIGCONT)
    result = archive(store, RecordingDispatcher(), stalled.sid)
    assert result.outcome == "archived"
    assert proc_state(stalled.pid) == "T"
    # Then that pass kills the job frozen (it never runs after the archive) and records it
    assert stalled.watchdog.poll() == [stalled.jid]
    victim.killed_within(stalled.leased, LEASE_MS / 1000 + 10)
    assert store.redis.hget(store.keys.job(stalled.jid), "state") == "lost"
    reason = store.redis.hget(store.keys.job(stalled.jid), "reason")
    assert f"archived:{stalled.sid}" in reason


def test_a_job_frozen_longer_than_the_freeze_bound_is_killed_and_counted_lost(
    private_redis: EmbeddedRedis,
    watchdog_store: Store,
    victim: Victim,
    freeze: Callable[[], None],
) -> None:
    store = watchdog_store
    # Given a running job, its watchdog freezing a job for at most 2 s
    stalled = Stalled(store, victim, freeze_max=2)
    jid, sid, watchdog = stalled.jid, stalled.sid, stalled.watchdog
    # When Redis stays frozen beyond it
    stalled.freeze_job(freeze)
    frozen = time.monotonic()
    poll_until(watchdog, lambda: victim.proc.poll() is not None, 10)
    # Then the job is killed (frozen) once frozen for the bound
    assert victim.proc.returncode == -signal.SIGKILL
    assert time.monotonic() - frozen >= 2 - watchdog.interval
    # And once Redis answers, the census counts it lost
    assert private_redis.pid is not None
    os.kill(private_redis.pid, signal.SIGCONT)
    assert not any(item.id == jid for item in census(store, sid))
    wait_for(
        lambda: store.redis.hget(store.keys.job(jid), "state") == "lost",
        10,
        message="the job recorded lost",
    )
