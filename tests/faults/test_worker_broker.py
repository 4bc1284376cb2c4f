"""Workers ride out a restarting and a full Redis, and readiness means consuming.

Each test runs real family workers (``LocalFleet``) against its own ``EmbeddedRedis``
(append-only), which it SIGKILLs and restarts by PID or squeezes with ``maxmemory`` and
``noeviction``; it drives them through its own ``Store`` and a ``CeleryDispatcher`` on a new
Celery app for that Redis.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery

from localfleet.embedded import EmbeddedRedis
from localfleet.fleet import LocalFleet, WorkerProcess
from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.settings import FleetSettings
from orchestrator.storage.heartbeats import live_workers
from orchestrator.storage.store import Store
from orchestrator.turn.turns import start_turn
from tests.helpers import STARTUP_TIMEOUT, wait_for
from tests.workers.support import turn_state, wait_log, wait_turn_state
from workers.app import configure
from workers.dispatch import CeleryDispatcher

# Each test starts workers (STARTUP_TIMEOUT) before what it checks.
pytestmark = [pytest.mark.redis, pytest.mark.timeout(STARTUP_TIMEOUT + 120)]

PREFIX = "brk:"


@dataclass
class Rig:
    redis: EmbeddedRedis
    fleet: LocalFleet
    store: Store
    dispatcher: CeleryDispatcher

    def worker(self, family: Family) -> WorkerProcess:
        [found] = [w for w in self.fleet.workers if w.family is family and not w.control]
        return found

    def heartbeat(self, family: Family) -> str:
        w = self.worker(family)
        return self.store.keys.worker_heartbeat(w.role, w.node)

    def ready(self, family: Family) -> bool:
        try:
            return bool(live_workers(self.store)[family.value])
        except Exception:  # Redis still away
            return False

    def prompt(self, text: str) -> tuple[str, str]:
        sid = create_session(self.store, "/tmp").session_id
        return sid, start_turn(self.store, self.dispatcher, sid, text)

    def crash_redis(self) -> None:
        """SIGKILL the Redis server by PID and start it again on the same port and files."""
        pid = self.redis.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.redis.running, timeout=5, message="redis-server to die")
        self.redis.stop()
        self.redis.start()

    def assert_alive(self) -> None:
        for w in self.fleet.workers:
            assert w.process.poll() is None, f"{w.family} worker exited:\n{self.fleet.tail(w)}"
            assert "Unrecoverable" not in w.log_path.read_text(errors="replace"), self.fleet.tail(w)


@pytest.fixture
def rig(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Rig]:
    store = Store(private_redis.url, PREFIX)
    app = Celery("agent_fleet_broker_faults")
    configure(app, FleetSettings(redis_url=private_redis.url, key_prefix=PREFIX))
    fleet = LocalFleet(
        private_redis.url,
        PREFIX,
        tmp_path / "fleet",
        hostname="brk",
        concurrency=8,
        extra_env={"FLEET_VISIBILITY_TIMEOUT_SECONDS": "3"},
    )
    try:
        yield Rig(private_redis, fleet, store, CeleryDispatcher(app))
    finally:
        fleet.stop(timeout=5)
        store.close()
        app.close()


def test_a_worker_with_a_step_in_flight_rides_out_redis_crashes_and_is_ready_again_by_itself(
    rig: Rig,
) -> None:
    # Given a turn worker and a job worker
    rig.fleet.start([Family.TURN, Family.JOB])
    rig.fleet.wait_ready(STARTUP_TIMEOUT)
    for crash in range(3):  # each crash the same proof; three show it holds again and again
        # ... with a long step in flight (a delivered, unacknowledged message)
        _, long_tid = rig.prompt("think 4")
        wait_for(
            lambda tid=long_tid: rig.store.redis.exists(rig.store.keys.step_lease(tid)),
            timeout=15,
            message="the long step to start",
        )
        # When Redis is SIGKILLed and restarted
        rig.crash_redis()
        # Then both workers are still there, report ready again without any help...
        wait_for(
            lambda: rig.ready(Family.TURN) and rig.ready(Family.JOB),
            timeout=20,
            message=f"the workers to be ready again after crash {crash + 1}",
        )
        rig.assert_alive()
        # ... and consume: a new turn with a job runs to the end
        _, tid = rig.prompt("exec 0.1\nsay hello")
        wait_turn_state(rig.store, tid, "completed", timeout=30)
    rig.assert_alive()


def test_a_full_redis_makes_workers_wait_not_exit_and_no_message_is_lost(rig: Rig) -> None:
    # Given turn and job workers, paused (SIGSTOP) while ten turns with a job each are queued
    rig.fleet.start([Family.TURN, Family.JOB])
    rig.fleet.wait_ready(STARTUP_TIMEOUT)
    for w in rig.fleet.workers:
        os.kill(w.process.pid, signal.SIGSTOP)
    tids = [rig.prompt("exec 0.1\nsay done")[1] for _ in range(10)]
    # When Redis is full (maxmemory with noeviction) as the workers resume
    client = rig.store.redis
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    for w in rig.fleet.workers:
        os.kill(w.process.pid, signal.SIGCONT)
    # Then the turn worker pops a message whose unacked record is refused, and carries on:
    # either it holds the message (fixed) or it ends (the fault)
    turn = rig.worker(Family.TURN)
    try:
        wait_for(
            lambda: (
                turn.process.poll() is not None
                or "held" in turn.log_path.read_text(errors="replace")
            ),
            timeout=20,
            message="the turn worker to meet the full Redis",
        )
    except pytest.fail.Exception:
        tail = turn.log_path.read_text(errors="replace")[-4000:]
        pytest.fail(f"the turn worker never met the full Redis in 20 s; its log ends:\n{tail}")
    rig.assert_alive()
    # When memory is available again; no process is restarted
    client.config_set("maxmemory", "0")
    # Then every queued turn runs to the end (nothing was lost) and the workers are ready
    for tid in tids:
        wait_for(
            lambda tid=tid: turn_state(rig.store, tid) == "completed",
            timeout=45,
            message=f"turn {tid} to complete (it is {turn_state(rig.store, tid)})",
        )
    wait_for(lambda: rig.ready(Family.TURN) and rig.ready(Family.JOB), timeout=15)
    rig.assert_alive()


def test_a_worker_in_warm_shutdown_behind_a_long_step_is_no_longer_ready(rig: Rig) -> None:
    # Given a ready turn worker running a long step
    rig.fleet.start([Family.TURN])
    rig.fleet.wait_ready(STARTUP_TIMEOUT)
    _, tid = rig.prompt("think 60")
    wait_for(
        lambda: rig.store.redis.exists(rig.store.keys.step_lease(tid)),
        timeout=15,
        message="the long step to start",
    )
    assert rig.ready(Family.TURN)
    # When it is asked to stop (SIGTERM: Celery's warm shutdown waits for the step)
    rig.worker(Family.TURN).process.send_signal(signal.SIGTERM)
    # Then it stops counting as ready within a few seconds, not when the step ends
    wait_for(
        lambda: not rig.store.redis.exists(rig.heartbeat(Family.TURN)),
        timeout=5,
        message="the heartbeat of the worker in warm shutdown to be gone",
    )
    assert not rig.ready(Family.TURN)


def test_a_job_worker_started_while_redis_is_down_waits_for_it_instead_of_exiting(
    private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    # Given the fleet's Redis down (a job worker must take its host name in Redis first)
    url = private_redis.url
    private_redis.stop()
    fleet = LocalFleet(url, "startup:", tmp_path / "fleet", hostname="startup")
    try:
        # When a job worker starts, and Redis comes back a few seconds later
        fleet.start([Family.JOB])
        [w] = fleet.workers
        wait_log(w, "Retrying", timeout=30)
        assert w.process.poll() is None, "the job worker exited while Redis was down"
        private_redis.start()
        # Then the same process takes its host name and becomes ready
        fleet.wait_ready(STARTUP_TIMEOUT)
        assert w.process.poll() is None
    finally:
        fleet.stop()
