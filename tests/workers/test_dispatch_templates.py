"""``CeleryDispatcher.send_many`` renders later messages of a (task, queue) from a template.

What it writes to Redis for messages rendered from a template (and their ``task-sent``
events, as Flower reads them) is compared with what ``send_task`` writes for the same task and
arguments: as decoded JSON of the whole envelope (headers, properties, body), where only ids,
delivery tags, the clock and the time may differ. A real worker consumes a rendered message,
a forked child renders its own, and every condition that leaves the message to Celery is
checked to do so.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery, _state, signals
from celery.contrib.testing.worker import start_worker

from orchestrator.settings import FleetSettings
from tests.helpers import count_round_trips
from tests.workers.support import next_events, subscribe_events
from workers import broker
from workers.app import configure
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.redis

QUEUE = "turn.ctl"
PAIR = ("turn.stop", QUEUE)
#: A name no shared task has (a process that imported the fleet's task modules registers
#: theirs first when an app is finalized).
TASK = f"probe.stop.{uuid.uuid4().hex[:8]}"
#: Arguments of every kind a stop message may carry, and a few more.
ARGS: list[list[Any]] = [
    ["s-1", ["t-1", "t-2"]],
    ["s-é", {"c-1": {"turns": ["t-'1'"], "jobs": ["\\n\n\u2603\U0001f600"]}}],
    ["s-2", [10**30, -(2**70), 1.5, 1e300, -0.0, True, None]],
    ["s-3", {"a": {"b": {"c": {"d": [1, [2, [3]]]}}}}],
    ["s-4", ["x" * 2000]],  # its repr is truncated by saferepr
    [],
]
#: Per envelope path, what differs between two messages by nature.
VARYING = {
    ("headers", "id"),
    ("headers", "root_id"),
    ("properties", "correlation_id"),
    ("properties", "delivery_tag"),
}
VARYING_EVENT = {("uuid",), ("root_id",), ("clock",), ("timestamp",)}


def _key(app: Celery, queue: str = QUEUE) -> str:
    return f"{app.conf.broker_transport_options['global_keyprefix']}{queue}"


def _pop_all(app: Celery, queue: str = QUEUE) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(app.conf.broker_url)
    raw = client.lrange(_key(app, queue), 0, -1)
    client.delete(_key(app, queue))
    return [json.loads(item) for item in reversed(raw)]


def _without(tree: dict[str, Any], paths: set[tuple[str, ...]]) -> dict[str, Any]:
    """``tree`` with its ``body`` decoded, without the fields at ``paths``."""
    out = json.loads(json.dumps(tree))
    if "body" in out and isinstance(out["body"], str):
        out["body"] = json.loads(base64.b64decode(out["body"]))
    for path in paths:
        holder = out
        for step in path[:-1]:
            holder = holder[step]
        del holder[path[-1]]
    return out


def _same_but_ids(message: dict[str, Any], single: dict[str, Any]) -> None:
    assert _without(message, VARYING) == _without(single, VARYING)
    assert message["body"] == single["body"]  # the same bytes, base64 and all
    ids = {message["headers"][k] for k in ("id", "root_id")}
    assert ids == {message["properties"]["correlation_id"]}


def _same_event_but_ids(event: dict[str, Any], single: dict[str, Any], task_id: str) -> None:
    body, single_body = _without(event, set())["body"], _without(single, set())["body"]
    assert {k: v for k, v in body.items() if (k,) not in VARYING_EVENT} == {
        k: v for k, v in single_body.items() if (k,) not in VARYING_EVENT
    }
    assert body["uuid"] == body["root_id"] == task_id
    rest = {("properties", "delivery_tag"), ("body",)}
    assert _without(event, rest) == _without(single, rest)


def test_templated_messages_and_events_are_what_send_task_writes(app: Celery) -> None:
    # Given what send_task writes for each kind of arguments
    dispatcher = CeleryDispatcher(app)
    events = subscribe_events(app)
    singles = []
    for args in ARGS:
        dispatcher.send("turn.stop", args, QUEUE)
        singles.append((_pop_all(app)[0], next_events(events, 1)[0]))

    # When they are sent in batches (the first message of the first batch teaches the
    # template, every later one is rendered from it)
    sent, clocks, times = [], [], []
    started = time.time()
    for _ in range(3):
        assert dispatcher.send_many([("turn.stop", a, QUEUE) for a in ARGS]) == [None] * 6
        sent.extend(zip(_pop_all(app), next_events(events, len(ARGS)), strict=True))
    events.close()

    # Then every message and event is send_task's but for ids, tags, clock and time
    assert dispatcher._templates.get(PAIR) is not None
    for i, (message, event) in enumerate(sent):
        single, single_event = singles[i % len(ARGS)]
        _same_but_ids(message, single)
        _same_event_but_ids(event, single_event, message["headers"]["id"])
        body = json.loads(base64.b64decode(event["body"]))
        clocks.append(body["clock"])
        times.append(body["timestamp"])
    ids = [m["headers"]["id"] for m, _ in sent]
    tags = [m["properties"]["delivery_tag"] for m, _ in sent]
    tags += [e["properties"]["delivery_tag"] for _, e in sent]
    assert len(set(ids)) == len(ids) and len(set(tags)) == len(tags)
    assert clocks == sorted(clocks) and len(set(clocks)) == len(clocks)
    assert started <= times[0] and times == sorted(times) and times[-1] <= time.time()


def test_a_reply_to_is_the_sending_thread_s(app: Celery) -> None:
    dispatcher = CeleryDispatcher(app)
    dispatcher.send_many([("turn.stop", ARGS[0], QUEUE)] * 2)
    thread = threading.Thread(target=dispatcher.send_many, args=([("turn.stop", ARGS[0], QUEUE)],))
    thread.start()
    thread.join(10)
    here, there = app.thread_oid, [m["properties"]["reply_to"] for m in _pop_all(app)]
    assert there[:2] == [here, here] and there[2] != here
    assert dispatcher._templates.get(PAIR) is not None


def test_a_refused_template_leaves_the_pair_with_celery(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a first message that its template does not render back (a wrong repr)
    monkeypatch.setattr(CeleryDispatcher, "_reprs", lambda self: lambda args: "not celery's")
    dispatcher = CeleryDispatcher(app)
    dispatcher.send("turn.stop", ARGS[1], QUEUE)
    (single,) = _pop_all(app)

    # When the pair is sent again and again
    for _ in range(3):
        assert dispatcher.send_many([("turn.stop", ARGS[1], QUEUE)]) == [None]

    # Then Celery built every message
    assert dispatcher._templates.known(PAIR) and dispatcher._templates.get(PAIR) is None
    for message in _pop_all(app):
        _same_but_ids(message, single)


def test_a_templated_batch_is_one_round_trip(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    dispatcher = CeleryDispatcher(app)
    queues = ["turn.ctl", "job.ctl.host-a", "subagent.ctl", "reminder.ctl"]
    batch = [(f"{q.split('.')[0]}.stop", ["s-1", ["x"]], q) for q in queues]
    assert dispatcher.send_many(batch) == [None] * 4  # learns the four templates
    writes = count_round_trips(monkeypatch)
    assert dispatcher.send_many(batch) == [None] * 4
    monkeypatch.undo()
    assert len(writes) == 1
    assert sum(w.count(b"LPUSH") for w in writes) == 4
    assert sum(w.count(b"PUBLISH") for w in writes) == 4
    for q in queues:
        assert len(_pop_all(app, q)) == 2


def test_a_real_worker_runs_a_templated_message(app: Celery, redis_url: str) -> None:
    # Given a worker of another app consuming the queue, where the task is registered
    worker_app = Celery("templates-worker")
    configure(worker_app, FleetSettings(redis_url=redis_url, key_prefix=_key(app, "")[:-7]))
    ran: list[Any] = []
    done = threading.Event()
    name = f"probe.run.{uuid.uuid4().hex[:8]}"

    @worker_app.task(name=name, shared=False)
    def probe(*args: Any) -> None:
        ran.append((probe.request.id, list(args)))
        if len(ran) == 2:
            done.set()

    dispatcher = CeleryDispatcher(app)
    queue = f"probe.{uuid.uuid4().hex[:8]}"
    # start_worker makes its app the current and the default one, for good: later tests
    # that call shared tasks from new threads would find this app's registry.
    saved = (_state._tls.current_app, _state.default_app)
    try:
        with start_worker(
            worker_app, pool="solo", perform_ping_check=False, queues=[queue], loglevel="WARNING"
        ):
            # When two messages are sent, the second rendered from a template
            assert dispatcher.send_many([(name, ARGS[1], queue)]) == [None]
            assert dispatcher._templates.get((name, queue)) is not None
            assert dispatcher.send_many([(name, ARGS[2], queue)]) == [None]
            # Then the worker runs both with their arguments
            assert done.wait(30)
    finally:
        _state._set_current_app(saved[0])
        _state.set_default_app(saved[1])
        worker_app.close()
    assert [args for _, args in ran] == [ARGS[1], ARGS[2]]


def test_a_forked_child_renders_messages_with_its_own_pid(app: Celery) -> None:
    dispatcher = CeleryDispatcher(app)
    events = subscribe_events(app)
    dispatcher.send_many([("turn.stop", ARGS[0], QUEUE)])
    assert dispatcher._templates.get(PAIR) is not None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's message is checked by the parent
        code = 0 if dispatcher.send_many([("turn.stop", ARGS[0], QUEUE)]) == [None] else 1
        os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
    parent_event, child_event = (
        json.loads(base64.b64decode(e["body"])) for e in next_events(events, 2)
    )
    events.close()
    parent, child = _pop_all(app)
    assert parent_event["pid"] == os.getpid() and child_event["pid"] == pid
    assert child["headers"]["origin"].startswith(f"gen{pid}@")
    assert child_event["uuid"] == child["headers"]["id"]


def _in_a_task(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    request = SimpleNamespace(id="parent-task", root_id="root-task", delivery_info={})
    task = SimpleNamespace(request=request, add_trail=lambda result: result)
    monkeypatch.setattr(Celery, "current_worker_task", property(lambda self: task))


def _registered(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(*args: Any) -> None:  # pragma: no cover - never run here
        return None

    app.task(name=TASK, shared=False)(stop)
    app.finalize()


def _receiver(signal: Any) -> Callable[[Celery, pytest.MonkeyPatch], None]:
    def connect(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
        def receiver(*args: Any, **kwargs: Any) -> None:
            return None

        # Connected to a copy of the receivers, which the test's end puts back as it was.
        monkeypatch.setattr(signal, "receivers", list(signal.receivers))
        signal.connect(receiver, weak=False)

    return connect


def _conf(**values: Any) -> Callable[[Celery, pytest.MonkeyPatch], None]:
    return lambda app, monkeypatch: app.conf.update(values)


FALLBACKS: dict[str, Callable[[Celery, pytest.MonkeyPatch], None]] = {
    "inside a worker task": _in_a_task,
    "task registered here": _registered,
    "task_routes": _conf(task_routes={"other.*": {"queue": "other"}}),
    "task_protocol 1": _conf(task_protocol=1),
    "pickle serializer": _conf(task_serializer="pickle", accept_content=["json", "pickle"]),
    "compression": _conf(task_compression="zlib"),
    "no task-sent events": _conf(task_send_sent_event=False),
    "kombu's own redis transport": _conf(broker_transport="redis"),
    "a result backend": lambda app, _: app.conf.update(result_backend=app.conf.broker_url),
    "before_task_publish receiver": _receiver(signals.before_task_publish),
    "after_task_publish receiver": _receiver(signals.after_task_publish),
}


@pytest.mark.parametrize("condition", sorted(FALLBACKS))
def test_each_fallback_condition_leaves_the_message_to_celery(
    app: Celery, monkeypatch: pytest.MonkeyPatch, condition: str
) -> None:
    # Given the condition
    FALLBACKS[condition](app, monkeypatch)
    rendered: list[Any] = []
    monkeypatch.setattr(broker.PublishBatch, "put", lambda self, cmds: rendered.append(cmds))
    dispatcher = CeleryDispatcher(app)

    # When a pair is sent several times
    for _ in range(3):
        assert dispatcher.send_many([(TASK, ARGS[0], QUEUE)] * 2) == [None, None]

    # Then no template was learned or used, and Celery published every message
    assert rendered == [] and not dispatcher._templates.known((TASK, QUEUE))
    assert len(_pop_all(app)) == 6
