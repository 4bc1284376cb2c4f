"""The watchdogs with their Redis frozen: the reads they cannot make must not hold up their
decisions. A shell command (the exec warden, ``orchestrator/execwatch.py``) or a job (the job
watchdog, ``orchestrator/jobwatch.py``) whose lease was last read is killed by that reading's
lapse time, before the lease lapses in the server, while the server answers nothing (SIGSTOP
of a private ``redis-server`` by its PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from api.embedded import EmbeddedRedis
from orchestrator import jobwatch, watchdogs
from orchestrator.execwatch import Warden
from orchestrator.ownership import process_start
from orchestrator.processes import die_with_parent
from orchestrator.store import Store
from tests.helpers import wait_for
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


def test_a_watched_job_dies_before_its_lease_lapses_while_redis_is_frozen(
    private_redis: EmbeddedRedis, victim: Victim, freeze: Callable[[], None]
) -> None:
    # The watchdog's store as its process makes it (watchdogs.own_store): READ_TIMEOUT
    timeout = watchdogs.READ_TIMEOUT
    store = Store(
        private_redis.url, "frozen-redis:", socket_timeout=timeout, connect_timeout=timeout
    )
    try:
        # Given a running job of this instance whose 6 s lease the watchdog has read once
        started = process_start(victim.proc.pid)
        jid = running_job(store, "/tmp/frozen-redis", victim.proc, started)
        store.redis.pexpire(store.keys.job_lease(jid), LEASE_MS)
        leased = time.monotonic()
        watchdog = jobwatch.Watchdog(store, "hostA", "hostA/test", LEASE_MS)
        assert watchdog.poll() == []
        # When Redis is frozen, and the watchdog polls as it runs
        freeze()
        while not watchdog.poll():
            assert time.monotonic() - leased < LEASE_MS / 1000 + 10, "never killed"
            time.sleep(watchdog.interval)
        # Then the job is killed before the lease would lapse in the server
        victim.killed_within(leased, LEASE_MS / 1000)
    finally:
        store.close()
