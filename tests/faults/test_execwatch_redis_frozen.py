"""The exec warden (``orchestrator/execwatch.py``) with its Redis frozen: the reads it cannot
make must not hold up its decisions. A command whose step lease it last read is killed by that
reading's lapse time, before the lease lapses in the server, while the server answers
nothing (SIGSTOP of a private ``redis-server`` by its PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from api.embedded import EmbeddedRedis
from orchestrator.execwatch import Warden
from orchestrator.processes import die_with_parent
from orchestrator.store import Store
from tests.helpers import wait_for

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
