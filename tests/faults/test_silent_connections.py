"""Connections that die silently (no reset: a hung primary, a vanished host, a NAT that dropped
the flow) make no worker deaf and no archive hang.

Real turn and job workers reach their own ``EmbeddedRedis`` through a TCP proxy of the tests'
own (``tests/tcp_proxy.py``) that freezes every connection open at a moment (nothing forwarded,
nothing closed) and lets new ones through. The test reads and writes Redis directly. Every
connection the workers hold is frozen: the consumer's ``BRPOP``, the producer, the event
publisher, remote control and the store's. Without socket timeouts a worker's main thread
waited forever on the reply to an event's ``PUBLISH``; with them the worker notices within
seconds and reconnects. The API's side: an archive whose stop fan-out meets a frozen broker
connection answers, and the ACP event relay's subscription is made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from celery import Celery

from api.acp.hub import EventHub
from localfleet.embedded import EmbeddedRedis
from localfleet.fleet import LocalFleet
from orchestrator.archiving.archive import archive
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.session.sessions import create_session
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from orchestrator.turn.turns import start_turn
from tests.faults.conftest import free_port
from tests.helpers import STARTUP_TIMEOUT, rest_client, wait_for, watching
from tests.tcp_proxy import TcpProxy
from tests.workers.support import wait_gone, wait_job_pid, wait_turn_state
from workers.app import configure
from workers.dispatch import CeleryDispatcher

pytestmark = [pytest.mark.redis, pytest.mark.timeout(STARTUP_TIMEOUT + 240)]

PREFIX = "silent:"
#: Seconds a worker on frozen connections may take to run a new turn: it must notice the
#: silence (a 5 s socket timeout, kombu's BRPOP check within 11 s) and reconnect.
RECOVERY_BOUND = 30.0
#: Seconds the API may take to answer an archive whose broker connection froze.
ANSWER_BOUND = 15.0


@dataclass
class Rig:
    proxy: TcpProxy
    fleet: LocalFleet
    store: Store  # direct: never frozen
    dispatcher: CeleryDispatcher  # direct
    proxied: CeleryDispatcher  # through the proxy, as an API's would be

    def new_session(self) -> str:
        return create_session(self.store, "/tmp/silent").session_id

    def running_job(self, dispatcher: Any) -> tuple[str, int]:
        sid = self.new_session()
        jid = jobs.create_job(self.store, dispatcher, sid, 300, "sleep 300")
        return sid, wait_job_pid(self.store, jid, timeout=30)

    def freeze(self) -> None:
        """Freeze every connection through the proxy, and wait until Redis holds no BRPOP
        of them any longer (kombu's BRPOP waits 1 s on the server). A message pushed while a
        frozen connection's BRPOP still waits is popped into the frozen connection and never
        read: kombu's at-most-once window, which the fleet's repairers cover (the archive
        reconciler, the turn sweeper), not what these tests are about."""
        assert self.proxy.freeze_open() > 0
        wait_for(
            lambda: not any("b" in c["flags"] for c in self.store.redis.client_list()),
            timeout=10,
            message="the frozen connections' BRPOPs to time out on the server",
        )

    def assert_alive(self) -> None:
        for w in self.fleet.workers:
            assert w.process.poll() is None, f"{w.node} exited:\n{self.fleet.tail(w)}"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    state: Path = tmp_path_factory.mktemp("silent")
    server = EmbeddedRedis(state / "redis", port=free_port())
    server.start()
    proxy = TcpProxy(server.port).start()
    store = Store(server.url, PREFIX)
    direct, proxied = Celery("silent_direct"), Celery("silent_proxied")
    configure(direct, FleetSettings(redis_url=server.url, key_prefix=PREFIX))
    configure(proxied, FleetSettings(redis_url=proxy.url, key_prefix=PREFIX))
    # A long job lease: a job must end by its archive's stop, not because its lease lapsed.
    fleet = LocalFleet(
        proxy.url,
        PREFIX,
        state / "fleet",
        hostname="silent",
        concurrency=4,
        control_families=(),
        extra_env={"FLEET_JOB_LEASE_SECONDS": "30"},
    )
    fleet.start([Family.TURN, Family.JOB])
    try:
        fleet.wait_ready(STARTUP_TIMEOUT)
        with watching(fleet, "silent"):
            yield Rig(proxy, fleet, store, CeleryDispatcher(direct), CeleryDispatcher(proxied))
    finally:
        proxy.stop()  # a hung call unblocks: its connection ends
        fleet.stop(timeout=5)
        store.close()
        direct.close()
        proxied.close()
        server.stop()


def test_workers_on_frozen_connections_stop_an_archived_job_and_run_a_new_turn(rig: Rig) -> None:
    # Given a session with a running job, and workers that just ran a turn
    sid, pid = rig.running_job(rig.dispatcher)
    warm = start_turn(rig.store, rig.dispatcher, rig.new_session(), "say warm")
    wait_turn_state(rig.store, warm, "completed", timeout=30)
    # When every connection the workers hold goes silent
    frozen_at = time.monotonic()
    rig.freeze()
    # ... and the session is archived with stopActivity (written directly)
    result = archive(rig.store, rig.dispatcher, sid, stop_activity=True)
    assert [item.family for item in result.stopped] == ["job"]
    # Then the job's process is gone within the bound: its worker noticed and reconnected
    wait_gone(pid, RECOVERY_BOUND)
    # And a new turn runs
    tid = start_turn(rig.store, rig.dispatcher, rig.new_session(), "say after the freeze")
    wait_turn_state(rig.store, tid, "completed", timeout=RECOVERY_BOUND)
    print(f"\njob gone and a new turn completed {time.monotonic() - frozen_at:.1f} s after")
    rig.assert_alive()


def test_the_api_answers_an_archive_whose_broker_connection_froze(rig: Rig) -> None:
    # Given an API whose broker connections go through the proxy, which started a job (so
    # it holds an open broker connection)
    sid, pid = rig.running_job(rig.proxied)
    with rest_client(store=rig.store, dispatcher=rig.proxied) as client:
        # When every connection through the proxy goes silent, the API's and the workers'
        rig.freeze()
        # ... and the session is archived with stopActivity
        answer: dict[str, Any] = {}

        def post() -> None:
            answer["response"] = client.post(
                f"/sessions/{sid}/archive", json={"stopActivity": True}
            )

        started = time.monotonic()
        caller = threading.Thread(target=post, daemon=True)
        caller.start()
        caller.join(ANSWER_BOUND)
        took = time.monotonic() - started
        if caller.is_alive():
            rig.proxy.close_frozen()  # let the hung request end before the client closes
            caller.join(30)
            pytest.fail(f"the archive did not answer within {ANSWER_BOUND:g} s")
    # Then it answered, archived, within the bound
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "archived"
    print(f"\narchive answered in {took:.1f} s: {response.json()['stopDispatch']}")
    # And the job's process is gone (the stop went out on a new connection, or the
    # reconciler's re-send would carry it; here the fan-out's retry does)
    wait_gone(pid, RECOVERY_BOUND)
    rig.assert_alive()


def test_the_acp_event_relay_hears_events_again_once_its_connection_went_silent(
    private_redis: EmbeddedRedis,
) -> None:
    channel = f"{PREFIX}events"

    async def relayed_after_freeze() -> float:
        with TcpProxy(private_redis.port) as proxy:
            # Given the relay of a process subscribed through the proxy, watching a session
            hub = EventHub(proxy.url, channel)
            await hub.start()
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            hub.watch("sess_silent", queue)
            publisher = aioredis.Redis.from_url(private_redis.url)
            try:
                # When its connection goes silent (no reset)
                assert proxy.freeze_open() == 1
                frozen_at = time.monotonic()
                # Then an event published now and then reaches the session's watcher again
                while time.monotonic() - frozen_at < RECOVERY_BOUND:
                    await publisher.publish(channel, json.dumps({"sessionId": "sess_silent"}))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(queue.get(), 0.5)
                        return time.monotonic() - frozen_at
                pytest.fail(f"no event relayed within {RECOVERY_BOUND:g} s of the freeze")
            finally:
                await publisher.aclose()
                if hub._task is not None:
                    hub._task.cancel()

    took = asyncio.run(relayed_after_freeze())
    print(f"\nevents relayed again {took:.1f} s after the freeze")
