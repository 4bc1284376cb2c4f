"""An ack or reject that a full Redis refuses frees the message's prefetch slot
(``workers.broker.QoS``). kombu frees the slot only after the write that drops the message's
unacked record, so on a ``maxmemory`` server each refused ack kept a slot, and once all were
kept the worker's consumer never asked for a message again: in the fault soak a turn worker
stayed up, idle, until it was shut down. The message's record stays, so it comes back after
the visibility timeout as a lost worker's messages do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Queue

from localfleet.embedded import EmbeddedRedis

pytestmark = pytest.mark.redis


@pytest.fixture
def channel(private_redis: EmbeddedRedis) -> Iterator[tuple[object, Queue, redis.Redis]]:
    # Visibility timeout 0: the sweep below restores what it finds at once.
    conn = Connection(
        private_redis.url,
        transport="workers.broker:Transport",
        transport_options={"visibility_timeout": 0},
    )
    client = redis.Redis.from_url(private_redis.url)
    try:
        ch = conn.channel()
        ch.basic_qos(0, 1, False)  # one message in flight, as the fleet's workers run
        queue = Queue("acked", Exchange("acked", type="direct"), "acked")(ch)
        queue.declare()
        producer = conn.Producer(ch)
        for n in range(2):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key="acked")
        yield ch, queue, client
    finally:
        client.config_set("maxmemory", "0")
        client.close()
        conn.release()


def _full(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")


@pytest.mark.parametrize("settle", ["ack", "reject", "requeue"])
def test_a_refused_ack_or_reject_frees_the_slot_and_keeps_the_record(
    channel: tuple[object, Queue, redis.Redis], settle: str
) -> None:
    ch, queue, client = channel
    qos = ch.qos  # type: ignore[attr-defined]
    # Given a message taken (its unacked record written), which fills the one slot
    message = queue.get(no_ack=False)
    assert message is not None and not qos.can_consume()
    tag = message.delivery_tag
    assert client.hexists(qos.unacked_key, tag)
    # When Redis is full as the message is settled, the write is refused
    _full(client)
    with pytest.raises(redis.RedisError):
        if settle == "ack":
            message.ack()
        else:
            message.reject(requeue=settle == "requeue")
    # Then the slot is free again: the consumer may ask for the next message
    assert qos.can_consume()
    # And the record stays, so the visibility sweep gives the message back
    client.config_set("maxmemory", "0")
    assert client.hexists(qos.unacked_key, tag)
    qos.restore_visible(num=10)
    assert not client.hexists(qos.unacked_key, tag)
    got = []
    for _ in range(2):
        nxt = queue.get(no_ack=True)
        assert nxt is not None
        got.append(nxt.payload["n"])
    assert sorted(got) == [0, 1]


def test_an_ack_redis_takes_frees_the_slot_as_before(
    channel: tuple[object, Queue, redis.Redis],
) -> None:
    ch, queue, client = channel
    message = queue.get(no_ack=False)
    assert message is not None
    message.ack()
    assert ch.qos.can_consume()  # type: ignore[attr-defined]
    assert not client.hexists(ch.qos.unacked_key, message.delivery_tag)  # type: ignore[attr-defined]
