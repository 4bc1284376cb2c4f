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

from api.embedded import EmbeddedRedis
from orchestrator import jobs, jobwatch, sessions
from orchestrator.execwatch import Warden
from orchestrator.ownership import process_start
from orchestrator.processes import die_with_parent
from orchestrator.store import Store
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import claim_job

LEASE_MS = 6000  # killed with a third (2 s) left; polled every 0.75 s


def test_a_watched_command_dies_before_its_lease_lapses_while_redis_is_frozen(
    private_redis: EmbeddedRedis,
) -> None:
    store = Store(private_redis.url, "frozen-redis:")
    warden = Warden(store)
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
    redis_pid = private_redis.pid
    assert redis_pid is not None
    frozen = False
    try:
        # Given a command whose step lease (6 s) the warden has read once
        store.redis.set(store.keys.step_lease("turn-f"), "tok", px=LEASE_MS)
        leased = time.monotonic()
        assert warden.watch("turn-f", "tok", LEASE_MS, proc.pid) is not None
        wait_for(
            lambda: int(store.redis.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0)),
            30,
            message="the warden's first read of the lease",
        )
        # When Redis is frozen (SIGSTOP by its PID): no read answers, and nobody renews
        os.kill(redis_pid, signal.SIGSTOP)
        frozen = True
        # Then the command is killed before the lease would lapse in the server
        assert proc.wait(LEASE_MS / 1000 + 10) == -signal.SIGKILL
        died = time.monotonic() - leased
        assert died < LEASE_MS / 1000, f"killed {died:.2f} s after the lease was set"
    finally:
        if frozen:
            os.kill(redis_pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        warden.close()
        store.close()


def test_a_watched_job_dies_before_its_lease_lapses_while_redis_is_frozen(
    private_redis: EmbeddedRedis,
) -> None:
    # The watchdog's store as its process makes it: reads give up after READ_TIMEOUT
    timeout = jobwatch.READ_TIMEOUT
    store = Store(
        private_redis.url, "frozen-redis:", socket_timeout=timeout, connect_timeout=timeout
    )
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
    redis_pid = private_redis.pid
    assert redis_pid is not None
    frozen = False
    try:
        # Given a running job of this instance whose 6 s lease the watchdog has read once
        sid = sessions.create_session(store, "/tmp/frozen-redis").session_id
        jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
        claim_job(store, jid, "hostA")
        started = repr(process_start(proc.pid))
        store.redis.hset(store.keys.job(jid), mapping={"pid": proc.pid, "pidStart": started})
        store.redis.pexpire(store.keys.job_lease(jid), LEASE_MS)
        leased = time.monotonic()
        watchdog = jobwatch.Watchdog(store, "hostA", "hostA/test", LEASE_MS)
        assert watchdog.poll() == []
        deaths: list[float] = []  # when the process died (its record may wait on Redis)
        waiter = threading.Thread(target=lambda: (proc.wait(), deaths.append(time.monotonic())))
        waiter.start()
        # When Redis is frozen (SIGSTOP by its PID), and the watchdog polls as it runs
        os.kill(redis_pid, signal.SIGSTOP)
        frozen = True
        while not watchdog.poll():
            assert time.monotonic() - leased < LEASE_MS / 1000 + 10, "never killed"
            time.sleep(watchdog.interval)
        # Then the job is killed before the lease would lapse in the server
        waiter.join(5)
        assert proc.returncode == -signal.SIGKILL
        died = deaths[0] - leased
        assert died < LEASE_MS / 1000, f"killed {died:.2f} s after the lease was set"
    finally:
        if frozen:
            os.kill(redis_pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        store.close()
