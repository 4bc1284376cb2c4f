"""Workers ride out ``NOREPLICAS``: a primary configured with ``min-replicas-to-write 1`` whose
replica is gone refuses every write (``BRPOP`` included, which pops), and no worker exits.

A private primary (``EmbeddedRedis``) with a real replica (another ``redis-server`` following
it with ``REPLICAOF``) and one real worker per family. The replica is SIGKILLed by PID: the
primary answers ``NOREPLICAS Not enough good replicas to write.`` to the consumers' ``BRPOP``,
the heartbeats and every script. Celery ended a worker on any reply its transport does not
count as a connection error ("Unrecoverable error", exit status 0); every worker of the
fleet exited this way.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

from localfleet.embedded import EmbeddedRedis
from localfleet.fleet import LocalFleet
from orchestrator.session.sessions import create_session
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from orchestrator.turn.turns import start_turn
from tests.faults.conftest import free_port
from tests.helpers import STARTUP_TIMEOUT, wait_for, watching
from tests.workers.support import log_text, wait_turn_state
from workers.app import configure
from workers.dispatch import CeleryDispatcher

pytestmark = [pytest.mark.redis, pytest.mark.timeout(STARTUP_TIMEOUT + 180)]

PREFIX = "noreplicas:"


@dataclass
class Rig:
    primary: EmbeddedRedis
    replica: EmbeddedRedis
    fleet: LocalFleet
    store: Store
    dispatcher: CeleryDispatcher

    def follow(self) -> None:
        """Make the replica follow the primary and wait until the primary counts it (a
        write is accepted again)."""
        with redis.Redis.from_url(self.replica.url, socket_timeout=5) as client:
            client.execute_command("REPLICAOF", "127.0.0.1", str(self.primary.port))
        wait_for(self.writable, timeout=30, message="the primary to accept writes again")

    def writable(self) -> bool:
        try:
            self.store.redis.set(f"{PREFIX}probe", "1")
        except redis.ResponseError as exc:  # NOREPLICAS
            assert "replicas" in str(exc), exc
            return False
        return True

    def prompt(self, text: str) -> str:
        sid = create_session(self.store, "/tmp/noreplicas").session_id
        return start_turn(self.store, self.dispatcher, sid, text)

    def assert_alive(self) -> None:
        for w in self.fleet.workers:
            assert w.process.poll() is None, f"{w.node} exited:\n{self.fleet.tail(w)}"
            assert "Unrecoverable" not in log_text(w), self.fleet.tail(w)


@pytest.fixture
def rig(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Rig]:
    replica = EmbeddedRedis(tmp_path / "replica", port=free_port())
    replica.start()
    store = Store(private_redis.url, PREFIX)
    app = Celery("agent_fleet_noreplicas")
    configure(app, FleetSettings(redis_url=private_redis.url, key_prefix=PREFIX))
    fleet = LocalFleet(
        private_redis.url,
        PREFIX,
        tmp_path / "fleet",
        hostname="norep",
        concurrency=4,
        control_families=(),
    )
    rig = Rig(private_redis, replica, fleet, store, CeleryDispatcher(app))
    try:
        rig.follow()
        with redis.Redis.from_url(private_redis.url, socket_timeout=5) as client:
            client.config_set("min-replicas-to-write", 1)
        fleet.start()
        fleet.wait_ready(STARTUP_TIMEOUT)
        with watching(fleet, "noreplicas"):
            yield rig
    finally:
        for w in fleet.workers:
            if w.process.poll() is None:
                w.process.send_signal(signal.SIGCONT)
        fleet.stop(timeout=5)
        store.close()
        app.close()
        replica.stop()


def test_no_worker_exits_on_noreplicas_and_a_turn_runs_once_the_replica_is_back(
    rig: Rig,
) -> None:
    # Given a primary that needs one replica for a write, its replica, a worker per family,
    # and a turn with a job that ran
    wait_turn_state(rig.store, rig.prompt("run 0.1\nsay before"), "completed", timeout=30)
    # When the replica is SIGKILLed: every write is refused with NOREPLICAS
    pid = rig.replica.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not rig.writable(), timeout=10, message="the primary to refuse writes")
    with pytest.raises(redis.ResponseError, match="replicas"):
        rig.store.redis.set(f"{PREFIX}refused", "1")
    # Then each worker meets the refusal again and again (its consumer reconnects, its BRPOP
    # is refused) and none exits (a worker's exit fails this wait at once)
    for w in rig.fleet.workers:
        wait_for(
            lambda w=w: log_text(w).count("enough good replicas") >= 2,
            timeout=60,
            message=f"{w.node} to meet NOREPLICAS twice",
        )
    rig.assert_alive()
    # When the replica is back
    rig.replica.stop()
    rig.replica.start()
    rig.follow()
    # Then a new turn with a job runs to the end, and every worker is still the same process
    wait_turn_state(rig.store, rig.prompt("run 0.1\nsay after"), "completed", timeout=90)
    rig.assert_alive()
