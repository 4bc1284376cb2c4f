"""The store and the broker transport follow a Sentinel failover without being rebuilt:
one primary, two replicas and three Sentinels on loopback; the primary is
SIGKILLed and the same ``Store`` and the same kombu ``Connection`` go on against the promoted
replica."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from bench.sentinels import SentinelGroup, sentinel_group
from orchestrator.errors import StoreUnavailable
from orchestrator.models.model import ScriptedModel
from orchestrator.session import sessions
from orchestrator.settings import FleetSettings
from orchestrator.storage.redisconn import SentinelOptions, async_client
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from tests.helpers import RecordingDispatcher, wait_for
from workers.app import sentinel_transport_options
from workers.retry import TRANSIENT

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path) as g:
        yield g


def test_store_follows_the_primary_through_a_failover(group: SentinelGroup) -> None:
    store = Store(group.url, "ha:", sentinel=SentinelOptions(group.master))
    store.redis.set("ha:before", "1")
    assert store.redis.info("server")["tcp_port"] == group.primary().port
    old = group.kill_primary()
    new = group.wait_promoted(old)

    def writes() -> bool:
        try:
            store.redis.set("ha:after", "1")
        except Exception:  # connection errors while the switch completes
            return False
        return True

    wait_for(writes, timeout=30)
    assert store.redis.info("server")["tcp_port"] == new.port
    assert new.client().get("ha:after") == "1"
    assert new.client().get("ha:before") == "1"
    store.close()


def test_store_unavailable_while_no_primary_is_known(group: SentinelGroup) -> None:
    store = Store(group.url, "ha:", sentinel=SentinelOptions("no-such-master"))
    with pytest.raises(StoreUnavailable):
        store.now_ms()


def test_broker_transport_follows_the_primary(group: SentinelGroup) -> None:
    settings = FleetSettings(redis_url=group.url, redis_sentinel_master=group.master)
    options = {"global_keyprefix": "ha:celery:", **sentinel_transport_options(group.url, settings)}
    with Connection(
        group.url, transport="workers.broker:SentinelTransport", transport_options=options
    ) as conn:
        queue = conn.SimpleQueue("ha-q")
        queue.put({"n": 1})
        first = queue.get(timeout=5)
        assert first.payload == {"n": 1}
        first.ack()
        # The ack must reach the replicas before the primary dies: replication is asynchronous,
        # and a lost ack leaves message 1 unacknowledged on the promoted node, which then
        # delivers it again (at least once). A write after it, WAITed for, carries it along.
        primary = group.primary().client(timeout=15)
        primary.set("ha:acked", "1")
        assert primary.wait(2, 10_000) == 2, "the replicas did not catch up"
        old = group.kill_primary()
        new = group.wait_promoted(old)
        published = conn.ensure(queue.producer, queue.put, max_retries=50, interval_start=0.2)
        published({"n": 2})
        # As Celery's consumer does after a connection error: a new channel on the connection
        # the publish re-established (to the promoted primary), then consume again.
        # The Sentinels also close the promoted node's clients once (CLIENT KILL while they
        # reconfigure), which a consumer meets as one more connection error.
        for _ in range(20):
            with contextlib.suppress(Exception):
                queue.close()
            conn.ensure_connection(max_retries=50, interval_start=0.2)
            queue = conn.SimpleQueue("ha-q")
            try:
                message = queue.get(timeout=10)
                break
            except conn.connection_errors:
                continue
        message.ack()
        assert message.payload == {"n": 2}
        assert conn.default_channel.client.info("server")["tcp_port"] == new.port
        queue.close()


def test_a_step_on_a_node_that_is_now_a_replica_does_not_run(group: SentinelGroup) -> None:
    # Given a running turn written on the primary, and a store whose node became a replica
    # (what a process still connected to a demoted primary reaches during the switch)
    primary = Store(group.url, "ha:", sentinel=SentinelOptions(group.master))
    recorder = RecordingDispatcher()
    sid = sessions.create_session(primary, "/tmp/ha").session_id
    tid = turns.start_turn(primary, recorder, sid, "say hello\nsay again")
    replica = next(n for n in group.data if n is not group.primary())
    wait_for(lambda: replica.client().exists(primary.keys.turn(tid)), message="replication")
    on_replica = Store(f"redis://127.0.0.1:{replica.port}/0", "ha:")
    # When its step is run there
    with pytest.raises(StoreUnavailable):
        steps.run_step(on_replica, recorder, ScriptedModel(), tools.run_tool, sid, tid, 0)
    # Then nothing ran (no model request, the turn still waits at step 0) and the task would
    # be retried (StoreUnavailable is transient for every fleet task)
    assert primary.redis.llen(primary.keys.model_requests(sid)) == 0
    turn = turns.get_turn(primary, tid)
    assert turn is not None and turn.step == 0
    assert StoreUnavailable in TRANSIENT
    # And run against the primary the Sentinels name, the same step runs
    assert steps.run_step(primary, recorder, ScriptedModel(), tools.run_tool, sid, tid, 0) == "ran"


def test_the_event_clients_follow_the_primary(group: SentinelGroup) -> None:
    # The API's event streams and ACP's relay use redis.asyncio through the same URL.
    async def roundtrip(key: str) -> str | None:
        client = async_client(group.url, SentinelOptions(group.master), decode_responses=True)
        try:
            await client.set(key, "1")
            value: str | None = await client.get(key)
            return value
        finally:
            await client.aclose()

    assert asyncio.run(roundtrip("ha:async:before")) == "1"
    new = group.wait_promoted(group.kill_primary())
    wait_for(lambda: _quietly(roundtrip, "ha:async:after"), timeout=30)
    assert new.client().get("ha:async:after") == "1"


def _quietly(fn: Any, key: str) -> bool:
    try:
        return asyncio.run(fn(key)) == "1"
    except Exception:  # connection errors while the switch completes
        return False
