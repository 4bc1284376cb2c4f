"""``CeleryDispatcher.send_many`` publishes ordinary Celery messages in one pipelined write.

The messages it writes to Redis, and the ``task-sent`` events Flower reads on the broker's
event channel, are compared field by field with what ``send_task`` writes for the same task:
from outside any task (where ``send_many`` builds them with Celery's building blocks itself),
from inside a worker task and for a task registered in the process (where it hands them to
``send_task``). The round trips are counted on the socket.
"""

from __future__ import annotations

import base64
import json
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.connection
from celery import Celery
from kombu.transport import redis as kombu_redis

from orchestrator.families import BatchDispatcher, send_all
from orchestrator.settings import FleetSettings
from tests.helpers import count_round_trips
from tests.workers.support import next_events, subscribe_events
from workers.app import configure
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.redis

#: Per message, the fields that differ by nature (ids, clocks, per-delivery tags).
VARYING_HEADERS = {"id", "root_id"}
VARYING_PROPERTIES = {"correlation_id", "delivery_tag"}
VARYING_EVENT_FIELDS = {"uuid", "root_id", "clock", "timestamp"}


def _queue_key(app: Celery, queue: str) -> str:
    return f"{app.conf.broker_transport_options['global_keyprefix']}{queue}"


def _pop_all(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    raw = client.lrange(key, 0, -1)
    client.delete(key)
    return [json.loads(item) for item in reversed(raw)]


def _shape(message: dict[str, Any], varying_body: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The message without the fields that vary per message, body decoded (without the keys
    ``varying_body`` of a body that is a mapping: an event's)."""
    headers = {k: v for k, v in message["headers"].items() if k not in VARYING_HEADERS}
    props = {k: v for k, v in message["properties"].items() if k not in VARYING_PROPERTIES}
    body = json.loads(base64.b64decode(message["body"]))
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in varying_body}
    rest = {k: v for k, v in message.items() if k not in ("headers", "properties", "body")}
    return {"headers": headers, "properties": props, "body": body, **rest}


def _same_as_send_task(app: Celery, redis_url: str, task: str = "turn.stop") -> None:
    """``send_many`` writes what ``send`` (``send_task``) writes for the same ``task``,
    message and ``task-sent`` event alike, apart from the fields that vary by nature."""
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(app)
    queue, key = "turn.ctl", _queue_key(app, "turn.ctl")
    args: list[Any] = ["s-1", {"c-1": {"turns": ["t-1"], "jobs": ["j-1"]}}]
    events = subscribe_events(app)

    dispatcher.send(task, args, queue)
    (single,) = _pop_all(client, key)
    (single_event,) = next_events(events, 1)
    assert dispatcher.send_many([(task, args, queue), (task, args, queue)]) == [
        None,
        None,
    ]
    batched = _pop_all(client, key)
    batched_events = next_events(events, 2)
    events.close()

    assert len(batched) == 2
    for message in batched:
        assert _shape(message) == _shape(single)
    varying = frozenset(VARYING_EVENT_FIELDS)
    for event, message in zip(batched_events, batched, strict=True):
        assert _shape(event, varying) == _shape(single_event, varying)
        body = json.loads(base64.b64decode(event["body"]))
        assert body["type"] == "task-sent" and body["uuid"] == message["headers"]["id"]


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


def test_batched_messages_and_events_match_send_task_field_by_field(
    app: Celery, redis_url: str
) -> None:
    _same_as_send_task(app, redis_url)


def test_inside_a_worker_task_batched_messages_carry_its_ids_as_send_task_does(
    app: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent from a task (the archive reconciler's stops), a message names the task as its
    parent and its root as root, as ``send_task`` makes it."""
    request = SimpleNamespace(id="parent-task", root_id="root-task", delivery_info={})
    task = SimpleNamespace(request=request, add_trail=lambda result: result)
    monkeypatch.setattr(Celery, "current_worker_task", property(lambda self: task))
    _same_as_send_task(app, redis_url)
    client = redis.Redis.from_url(redis_url)
    CeleryDispatcher(app).send_many([("turn.stop", ["s-1", []], "turn.ctl")])
    (message,) = _pop_all(client, _queue_key(app, "turn.ctl"))
    assert (message["headers"]["parent_id"], message["headers"]["root_id"]) == (
        "parent-task",
        "root-task",
    )


def test_a_task_registered_here_keeps_its_own_options_in_a_batch(
    app: Celery, redis_url: str
) -> None:
    """In a worker, the stop tasks are registered: their options apply as ``send_task``
    applies them."""

    # A name no shared task has: once this process has imported the fleet's task modules,
    # finalizing any app registers their shared tasks first (turn.stop among them), and a
    # second callable under the same name is not registered.
    name = f"probe.stop.{uuid.uuid4().hex[:8]}"

    @app.task(name=name, time_limit=30, soft_time_limit=20, shared=False)
    def stop(*args: Any) -> None:  # pragma: no cover - never run here
        return None

    app.finalize()
    _same_as_send_task(app, redis_url, name)
    client = redis.Redis.from_url(redis_url)
    CeleryDispatcher(app).send_many([(name, ["s-1", []], "turn.ctl")])
    (message,) = _pop_all(client, _queue_key(app, "turn.ctl"))
    assert message["headers"]["timelimit"] == [30, 20]


def test_batches_share_the_channel_s_redis_client(
    app: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu builds a Redis client per publish batch (its reply parsers set up each time);
    the fleet's channel keeps one per connection pool, and builds a new one, still
    publishing, once the pool is replaced (as after a lost connection)."""
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(app)
    message = ("turn.stop", ["s-1", []], "turn.ctl")
    key = _queue_key(app, "turn.ctl")
    assert dispatcher.send_many([message]) == [None]
    built: list[Any] = []
    real = kombu_redis.Channel._create_client

    def create_client(self: Any, asynchronous: bool = False) -> Any:
        built.append(asynchronous)
        return real(self, asynchronous=asynchronous)

    monkeypatch.setattr(kombu_redis.Channel, "_create_client", create_client)
    for _ in range(5):
        assert dispatcher.send_many([message, message]) == [None, None]
    assert built == []
    with app.producer_or_acquire() as producer:
        producer.channel._disconnect_pools()
    assert dispatcher.send_many([message]) == [None]
    assert built == [False]
    assert len(_pop_all(client, key)) == 12


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
    writes = count_round_trips(monkeypatch)
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


def test_a_batch_goes_out_in_one_socket_write(
    app: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py cuts a pipeline into pieces of about 6 kB, and a server that reads the first
    piece alone fsyncs its append-only file once per piece: an archive's four stops and
    their events (about 8 kB) go out as one piece."""
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(app)
    ids = [f"t-{i:04d}" for i in range(40)]
    messages = [
        ("turn.stop", ["s-1", ids], "turn.ctl"),
        ("job.stop", ["s-1", ids], "job.ctl.host-a"),
        ("subagent.stop", ["s-1", {"c-1": {"turns": ids}}], "subagent.ctl"),
        ("reminder.stop", ["s-1", ids], "reminder.ctl"),
    ]
    assert dispatcher.send_many(messages) == [None] * 4  # connects, declares the queues
    pieces: list[int] = []
    real = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        if not isinstance(command, bytes | str):
            pieces.append(len(command))
        real(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    assert dispatcher.send_many(messages) == [None] * 4
    monkeypatch.undo()
    assert pieces == [1]
    for _, _, queue in messages:
        assert len(_pop_all(client, _queue_key(app, queue))) == 2


def test_a_failed_batch_reports_every_message(redis_url: str) -> None:
    app = Celery("batch-down")
    configure(app, FleetSettings(redis_url="redis://127.0.0.1:1/0", key_prefix="unused:"))
    app.conf.broker_connection_timeout = 0.2
    errors = CeleryDispatcher(app).send_many(
        [("turn.stop", ["s", []], "turn.ctl"), ("reminder.stop", ["s", []], "reminder.ctl")]
    )
    assert len(errors) == 2 and all(isinstance(e, Exception) for e in errors)
    app.close()
