"""Redis down: every lifecycle call answers a clear "store unavailable" error in bounded time,
the gate fails closed, nothing is half written, and the same processes recover on their own.

Redis is really stopped (the test's own ``EmbeddedRedis``; never the shared test server), not
paused. The same ``Store`` object, the same REST app (``TestClient``) and the same ACP
connection (``AcpConnection``) are used before, during and after the outage.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

import api.rest
from api.acp import AcpConnection, EventHub
from localfleet.embedded import EmbeddedRedis
from orchestrator.archiving import archive
from orchestrator.errors import FleetError, StoreUnavailable
from orchestrator.models.model import Emit, ScriptedModel, StepAnswer, StepRequest
from orchestrator.session import gate, sessions, titles
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from tests.faults.conftest import assert_consistent
from tests.helpers import RecordingDispatcher, wait_for

pytestmark = pytest.mark.redis

#: How long any call may take to report the outage (seconds): a backstop against a call that
#: hangs (until Redis thaws, or for ever), generous enough for a loaded machine. Reads retry for
#: up to 2 s (``orchestrator.storage.store.retried``) on a 2 s socket timeout; writes are not
# retried.
#: The test prints the figures it saw (``pytest -s``); they are a benchmark's business.
BOUND = 20.0
STORE_UNAVAILABLE_RPC = -32010
PREFIX = "down:"


def timed(fn: Callable[[], Any]) -> tuple[float, BaseException | None]:
    """Seconds ``fn`` took and what it raised (``None`` if it returned)."""
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - returned to the caller to assert on
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


def at_once(calls: dict[str, Callable[[], Any]]) -> dict[str, tuple[float, Any]]:
    """Run every call at the same time, each in a thread of its own (as the API's callers
    would meet an outage): per name, the seconds it took and what it returned or raised.
    A read reports the outage once its retries ran out (``orchestrator.storage.store.retried``, 2
    s):
    one call after the other, those waits were most of the test's time."""

    def one(call: Callable[[], Any]) -> tuple[float, Any]:
        start = time.monotonic()
        try:
            out = call()
        except BaseException as exc:  # noqa: BLE001 - returned to the caller to assert on
            out = exc
        return time.monotonic() - start, out

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {name: pool.submit(one, call) for name, call in calls.items()}
        return {name: f.result() for name, f in futures.items()}


def cwd() -> str:
    return f"/tmp/fleet-faults/{uuid.uuid4().hex}"


@pytest.fixture
def store(private_redis: EmbeddedRedis) -> Iterator[Store]:
    s = Store(private_redis.url, PREFIX)
    yield s
    s.close()


@pytest.fixture
def client(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The REST app of this process, wired to the private Redis."""
    monkeypatch.delenv("FLEET_API_TOKEN", raising=False)
    app = api.rest.create_app(FleetSettings(), store=store, dispatcher=RecordingDispatcher())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


class Acp:
    """An ``AcpConnection`` driven on one event loop of its own, request by request."""

    def __init__(self, store: Store, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.replies: list[dict[str, Any]] = []
        self.next_id = 0

        async def send(message: dict[str, Any]) -> None:
            self.replies.append(message)

        self.hub = EventHub(url, store.keys.events)
        self.conn = AcpConnection(send, store, RecordingDispatcher(), self.hub)

    def call(self, method: str, params: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
        self.next_id += 1
        msg_id = self.next_id

        async def go() -> dict[str, Any]:
            await self.conn.handle_text(
                json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for reply in self.replies:
                    if reply.get("id") == msg_id:
                        return reply
                await asyncio.sleep(0.005)
            raise AssertionError(f"no answer to {method} within {timeout}s")

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        async def shut() -> None:
            await self.conn.close()
            relay = self.hub._task
            if relay is not None:
                relay.cancel()
                await asyncio.gather(relay, return_exceptions=True)

        self.loop.run_until_complete(shut())
        self.loop.close()


class CountingModel(ScriptedModel):
    """The scripted model, counting its requests."""

    def __init__(self) -> None:
        self.requests = 0

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        self.requests += 1
        return super().step(request, cancel, emit)


def test_redis_down_answers_store_unavailable_fails_closed_and_recovers(
    private_redis: EmbeddedRedis, store: Store, client: TestClient
) -> None:
    # Given sessions in both states, and a REST app and an ACP connection that have talked to
    # Redis already (pooled connections, the event relay subscribed)
    where = cwd()
    rec = RecordingDispatcher()
    active = sessions.create_session(store, where).session_id
    archived = sessions.create_session(store, where).session_id
    archive.archive(store, rec, archived)
    prompted = sessions.create_session(store, where).session_id
    tid = turns.start_turn(store, rec, prompted, "say hello")
    acp = Acp(store, private_redis.url)
    assert "result" in acp.call("initialize", {"protocolVersion": 1})
    assert "result" in acp.call("session/list", {})
    assert client.get("/sessions").status_code == 200

    # When Redis stops
    private_redis.stop()

    # Then every operation answers StoreUnavailable within the bound, in process...
    calls: dict[str, Callable[[], Any]] = {
        "archive": lambda: archive.archive(store, rec, active),
        "archive(stopActivity)": lambda: archive.archive(store, rec, active, stop_activity=True),
        "unarchive": lambda: archive.unarchive(store, archived),
        "list": lambda: sessions.list_sessions(store, archived="include"),
        "get": lambda: sessions.get_session(store, active),
        "set_title": lambda: titles.set_title(store, active, "while down"),
        "create": lambda: sessions.create_session(store, where),
        "prompt": lambda: turns.start_turn(store, rec, active, "say x"),
        "gate.admit": lambda: gate.admit(store, active),
    }
    took: dict[str, float] = {}
    for name, (took[name], raised) in at_once(calls).items():
        assert isinstance(raised, StoreUnavailable), f"{name} raised {raised!r}"
        assert "store is unavailable" in raised.message
        assert took[name] < BOUND, f"{name} took {took[name]:.2f}s"

    # ... the gate fails closed: a step is not run, no model request is made...
    model = CountingModel()
    took["turn step"], raised = timed(
        lambda: steps.run_step(store, rec, model, tools.run_tool, prompted, tid, 0)
    )
    assert isinstance(raised, StoreUnavailable)
    assert model.requests == 0

    # ... over REST: 503 store_unavailable, and over ACP: JSON-RPC error -32010 with a
    # readable message (the REST calls at once; the ACP ones, on their connection's one event
    # loop, one after the other beside them)
    rest_calls: dict[str, Callable[[], Any]] = {
        "POST archive": lambda: client.post(f"/sessions/{active}/archive", json={}),
        "POST archive stop": lambda: client.post(
            f"/sessions/{active}/archive", json={"stopActivity": True}
        ),
        "POST unarchive": lambda: client.post(f"/sessions/{archived}/unarchive"),
        "GET sessions": lambda: client.get("/sessions", params={"archived": "include"}),
        "PUT title": lambda: client.put(f"/sessions/{active}/title", json={"title": "t"}),
    }
    acp_calls = {
        "session/archive": {"sessionId": active},
        "session/unarchive": {"sessionId": archived},
        "session/list": {},
        "session/set_title": {"sessionId": active, "title": "t"},
    }

    def over_acp() -> dict[str, tuple[float, Any]]:
        answered = {}
        for method, params in acp_calls.items():
            start = time.monotonic()
            reply = acp.call(method, params)
            answered[method] = (time.monotonic() - start, reply)
        return answered

    answers = at_once({**rest_calls, "ACP": over_acp})
    for name in rest_calls:
        took[name], resp = answers[name]
        assert not isinstance(resp, BaseException), f"{name} raised {resp!r}"
        assert resp.status_code == 503, f"{name}: {resp.status_code} {resp.text}"
        error = resp.json()["error"]
        assert error["code"] == "store_unavailable"
        assert "store is unavailable" in error["message"]
        assert took[name] < BOUND
    acp_answers = answers["ACP"][1]
    assert isinstance(acp_answers, dict), f"ACP raised {acp_answers!r}"
    for method, (took[method], reply) in acp_answers.items():
        assert reply.get("error", {}).get("code") == STORE_UNAVAILABLE_RPC, reply
        assert "store is unavailable" in reply["error"]["message"]
        assert took[method] < BOUND
    print("\nseconds to answer while Redis is down:")
    for name, seconds in took.items():
        print(f"  {name:24} {seconds:.3f}")

    # When Redis comes back (same state directory and port); no process is restarted
    private_redis.start()

    # Then nothing was half written and nothing changed while it was down...
    assert_consistent(store)
    assert not sessions.get_session(store, active).archived
    assert sessions.get_session(store, active).title == ""
    assert sessions.get_session(store, archived).archived
    # ... and the same Store, REST app and ACP connection work again
    wait_for(lambda: _answers(lambda: gate.admit(store, active)), timeout=15, message="recovery")
    assert archive.archive(store, rec, active).outcome == "archived"
    assert archive.unarchive(store, active) == 1
    assert titles.set_title(store, active, "back") == "back"
    resp = client.post(f"/sessions/{archived}/unarchive")
    assert resp.status_code == 200, resp.text
    resp = client.put(f"/sessions/{archived}/title", json={"title": "rest"})
    assert resp.status_code == 200, resp.text
    assert "result" in acp.call("session/archive", {"sessionId": archived})
    assert "result" in acp.call("session/unarchive", {"sessionId": archived})
    assert "result" in acp.call("session/set_title", {"sessionId": archived, "title": "acp"})
    listed = acp.call("session/list", {"cwd": where})["result"]["sessions"]
    assert {s["sessionId"] for s in listed} == {active, archived, prompted}
    assert client.get("/sessions", params={"cwd": where}).status_code == 200
    # ... and the step that could not read the gate runs when retried
    assert steps.run_step(store, rec, model, tools.run_tool, prompted, tid, 0) == "completed"
    assert model.requests == 1
    assert_consistent(store)
    acp.close()


def test_a_frozen_redis_is_reported_within_the_socket_timeout(
    private_redis: EmbeddedRedis, store: Store
) -> None:
    # Given a session, and Redis frozen (SIGSTOP: connections hang instead of being refused)
    rec = RecordingDispatcher()
    sid = sessions.create_session(store, cwd()).session_id
    pid = private_redis.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        # When lifecycle calls and the gate are asked (at once)
        calls: dict[str, Callable[[], Any]] = {
            "archive": lambda: archive.archive(store, rec, sid),
            "get": lambda: sessions.get_session(store, sid),
            "gate.admit": lambda: gate.admit(store, sid),
        }
        for name, (seconds, raised) in at_once(calls).items():
            # Then each answers StoreUnavailable (a timeout) within the bound
            assert isinstance(raised, StoreUnavailable), f"{name} raised {raised!r}"
            assert seconds < BOUND, f"{name} took {seconds:.2f}s"
            print(f"\n{name} against a frozen Redis: {seconds:.3f}s")
    finally:
        os.kill(pid, signal.SIGCONT)
    # And once it thaws, the same Store works; the archive that timed out was not applied
    # twice or half: it either happened or not, and a retry settles it
    wait_for(lambda: _answers(lambda: gate.admit(store, sid)) or _archived(store, sid), timeout=15)
    assert archive.archive(store, rec, sid).outcome in ("archived", "already_archived")
    assert sessions.get_session(store, sid).archived
    assert_consistent(store)


def _archived(store: Store, sid: str) -> bool:
    try:
        return sessions.get_session(store, sid).archived
    except FleetError:
        return False


def _answers(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except FleetError:
        return False
    return True


def test_a_crash_in_the_middle_of_concurrent_archives_leaves_nothing_half_written(
    private_redis: EmbeddedRedis, store: Store
) -> None:
    # Given trees of sessions (root, two children, a grandchild) and threads archiving and
    # unarchiving them as fast as they can
    where = cwd()
    rec = RecordingDispatcher()
    roots = []
    for _ in range(12):
        root = sessions.create_session(store, where).session_id
        kid = sessions.create_session(store, where, parent_id=root).session_id
        sessions.create_session(store, where, parent_id=root)
        sessions.create_session(store, where, parent_id=kid)
        roots.append(root)
    failures: list[BaseException] = []
    stop = threading.Event()
    done = [0]
    refused = [0]  # writes that met the outage

    def churn(mine: list[str]) -> None:
        while not stop.is_set():
            for sid in mine:
                try:
                    archive.archive(store, rec, sid, stop_activity=True)
                    archive.unarchive(store, sid)
                    done[0] += 1
                except StoreUnavailable:
                    refused[0] += 1
                    time.sleep(0.01)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    failures.append(exc)
                    return

    threads = [threading.Thread(target=churn, args=(roots[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        # When Redis is SIGKILLed while the writes are in flight, then restarted
        wait_for(lambda: done[0] >= 40, timeout=10, message="churn to get going")
        pid = private_redis.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not private_redis.running, timeout=5, message="redis-server to die")
        wait_for(lambda: refused[0] >= 4, timeout=30, message="the writers to meet the outage")
        private_redis.stop()
        private_redis.start()
        before = done[0]
        wait_for(lambda: done[0] >= before + 40, timeout=10, message="churn to resume")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert not failures, failures
    # Then every session is wholly archived or wholly not, and so are the trees
    assert_consistent(store)


def test_readiness_answers_not_ready_within_its_bound_when_the_broker_is_frozen(
    private_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given readiness checking a broker (a Celery app on the private Redis) that is frozen:
    # it accepts connections and never answers
    from celery import Celery

    from api.routes.operations import broker_reachable
    from orchestrator.settings import FleetSettings
    from workers.app import configure
    from workers.dispatch import CeleryDispatcher

    app = Celery("agent_fleet_ready_probe")
    configure(app, FleetSettings(redis_url=private_redis.url, key_prefix="ready-probe:"))
    dispatcher = CeleryDispatcher(app)
    assert broker_reachable(dispatcher)
    pid = private_redis.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        # When the broker check runs
        seconds, raised = timed(lambda: assert_unreachable(broker_reachable(dispatcher)))
    finally:
        os.kill(pid, signal.SIGCONT)
        app.close()
    # Then it says "not reachable" within its bound instead of hanging until the thaw
    assert raised is None, raised
    assert seconds < BOUND, f"the broker check took {seconds:.2f}s"


def assert_unreachable(reachable: bool) -> None:
    assert reachable is False
