"""The store and the broker transport follow a Sentinel failover without being rebuilt
(issue 15): one primary, two replicas and three Sentinels on loopback; the primary is
SIGKILLed and the same ``Store`` and the same kombu ``Connection`` go on against the promoted
replica."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection

from bench.sentinels import SentinelGroup, sentinel_group
from orchestrator.errors import StoreUnavailable
from orchestrator.redisconn import SentinelOptions
from orchestrator.settings import FleetSettings
from orchestrator.store import Store
from tests.helpers import wait_for
from workers.app import sentinel_transport_options

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
        assert queue.get(timeout=5).payload == {"n": 1}
        old = group.kill_primary()
        new = group.wait_promoted(old)
        published = conn.ensure(queue, queue.put, max_retries=50, interval_start=0.2)
        published({"n": 2})
        # As Celery's consumer does on a connection error: reconnect, consume again.
        for _ in range(50):
            try:
                message = queue.get(timeout=10)
                break
            except conn.connection_errors:
                queue.close()
                conn.ensure_connection(max_retries=50, interval_start=0.2)
                queue = conn.SimpleQueue("ha-q")
        message.ack()
        assert message.payload == {"n": 2}
        assert conn.default_channel.client.info("server")["tcp_port"] == new.port
        queue.close()
