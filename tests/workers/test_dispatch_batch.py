"""``CeleryDispatcher.send_many`` publishes ordinary Celery messages in one pipelined write.

The messages it writes to Redis are compared field by field with what ``send_task`` writes for
the same task, and the ``task-sent`` events Flower reads are counted on the broker's event
channel; the round trips are counted with Redis's own ``INFO commandstats``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection
from celery import Celery

from orchestrator.families import BatchDispatcher, send_all
from orchestrator.settings import FleetSettings
from workers.app import configure
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.redis

#: Per message, the fields that differ by nature (ids, clocks, per-delivery tags).
VARYING_HEADERS = {"id", "root_id"}
VARYING_PROPERTIES = {"correlation_id", "delivery_tag"}


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    prefix = f"fleet-test-batch-{uuid.uuid4().hex[:8]}:"
    app = Celery("batch-test")
    configure(app, FleetSettings(redis_url=redis_url, key_prefix=prefix))
    yield app
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    app.close()


def _queue_key(app: Celery, queue: str) -> str:
    return f"{app.conf.broker_transport_options['global_keyprefix']}{queue}"


def _pop_all(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    raw = client.lrange(key, 0, -1)
    client.delete(key)
    return [json.loads(item) for item in reversed(raw)]


def _shape(message: dict[str, Any]) -> dict[str, Any]:
    """The message without the fields that vary per message, body decoded."""
    headers = {k: v for k, v in message["headers"].items() if k not in VARYING_HEADERS}
    props = {k: v for k, v in message["properties"].items() if k not in VARYING_PROPERTIES}
    body = json.loads(base64.b64decode(message["body"]))
    rest = {k: v for k, v in message.items() if k not in ("headers", "properties", "body")}
    return {"headers": headers, "properties": props, "body": body, **rest}


def test_batched_messages_are_what_send_task_writes(app: Celery, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(app)
    queue = "turn.ctl"
    key = _queue_key(app, queue)
    args: list[Any] = ["s-1", ["t-1", "t-2"]]

    dispatcher.send("turn.stop", args, queue)
    (single,) = _pop_all(client, key)
    assert dispatcher.send_many([("turn.stop", args, queue), ("turn.stop", args, queue)]) == [
        None,
        None,
    ]
    batched = _pop_all(client, key)

    assert len(batched) == 2
    for message in batched:
        assert _shape(message) == _shape(single)
    assert batched[0]["headers"]["id"] != batched[1]["headers"]["id"]
    assert _shape(single)["body"][0] == args


def test_a_batch_is_one_round_trip_and_emits_task_sent(
    app: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(app)
    messages = [
        ("turn.stop", ["s-1", ["t-1"]], "turn.ctl"),
        ("job.stop", ["s-1", ["j-1"]], "job.ctl.host-a"),
        ("subagent.stop", ["s-1", {}], "subagent.ctl"),
        ("reminder.stop", ["s-1", ["r-1"]], "reminder.ctl"),
    ]
    for task, _, queue in messages:  # connects and declares each queue once, as a fleet has
        dispatcher.send(task, ["warm", []], queue)
        _pop_all(client, _queue_key(app, queue))

    events = client.pubsub()
    events.psubscribe(f"{app.conf.broker_transport_options['global_keyprefix']}*")
    assert events.get_message(timeout=5)["type"] == "psubscribe"
    writes = _count_writes(monkeypatch)
    assert isinstance(dispatcher, BatchDispatcher)
    assert send_all(dispatcher, messages) == [None] * 4
    assert len(writes) == 1, "the four messages and their events are one pipelined write"
    assert sum(w.count(b"LPUSH") for w in writes) == 4

    sent = []
    while (msg := events.get_message(timeout=5)) is not None:
        if msg["type"] == "pmessage":
            event = json.loads(base64.b64decode(json.loads(msg["data"])["body"]))
            sent.append((event["type"], event["name"], event["queue"]))
        if len(sent) == len(messages):
            break
    events.close()
    assert sent == [("task-sent", task, queue) for task, _, queue in messages]
    for task, args, queue in messages:
        (message,) = _pop_all(client, _queue_key(app, queue))
        assert message["headers"]["task"] == task
        assert json.loads(base64.b64decode(message["body"]))[0] == args


def test_a_failed_batch_reports_every_message(redis_url: str) -> None:
    app = Celery("batch-down")
    configure(app, FleetSettings(redis_url="redis://127.0.0.1:1/0", key_prefix="unused:"))
    app.conf.broker_connection_timeout = 0.2
    errors = CeleryDispatcher(app).send_many(
        [("turn.stop", ["s", []], "turn.ctl"), ("reminder.stop", ["s", []], "reminder.ctl")]
    )
    assert len(errors) == 2 and all(isinstance(e, Exception) for e in errors)
    app.close()


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Record every write redis-py makes to a socket from now on (one per round trip)."""
    writes: list[bytes] = []
    real = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, bytes | str) else list(command)
        writes.append(b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts))
        real(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    return writes
