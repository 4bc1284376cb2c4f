"""``fleet acp`` while Redis is down (a closed port, or a private ``redis-server`` stopped with
SIGSTOP): every request read before stdin closes is answered before the process exits, and
the event relay's outage is logged once, never twice a second and never with an empty
reason."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
import redis

from tests.api.test_acp_stdio import INITIALIZE, TIMEOUT, StdioAgent
from tests.helpers import STARTUP_TIMEOUT, wait_for

STORE_UNAVAILABLE, REQUEST_CANCELLED = -32010, -32800


def free_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def agent_on(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[StdioAgent]:
    monkeypatch.setenv("FLEET_REDIS_URL", url)
    agent = StdioAgent("redis-down")
    try:
        yield agent
    finally:
        agent.close()


def relay_lines(agent: StdioAgent) -> list[str]:
    return [line for line in agent.stderr().splitlines() if "event relay" in line]


def test_a_request_pending_at_stdin_eof_is_answered_with_redis_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with agent_on(f"redis://127.0.0.1:{free_port()}/0", monkeypatch) as agent:
        agent.send(INITIALIZE)
        agent.send({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}})
        assert agent.proc.stdin is not None
        agent.proc.stdin.close()
        # The process starts, answers and exits: the bound is its start's.
        assert agent.proc.wait(STARTUP_TIMEOUT) == 0, agent.stderr()
        agent._reader.join(5)
        _, answer = agent.response(1, 1)
        assert answer["error"]["code"] == STORE_UNAVAILABLE, answer
        agent.check_clean()


def test_the_relay_outage_is_logged_once_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    with agent_on(f"redis://127.0.0.1:{free_port()}/0", monkeypatch) as agent:
        agent.send(INITIALIZE)
        # Each session/list fails after the store's retry bound: the window the relay's
        # retries are counted over.
        for rid in (1, 2, 3):
            agent.send({"jsonrpc": "2.0", "id": rid, "method": "session/list", "params": {}})
            # (the first answer also waits for the process to start)
            bound = STARTUP_TIMEOUT if rid == 1 else TIMEOUT
            assert agent.response(rid, bound)[1]["error"]["code"] == STORE_UNAVAILABLE
        lines = relay_lines(agent)
        assert 1 <= len(lines) <= 2, lines
        reasons = [json.loads(line)["message"].rstrip() for line in lines]
        assert not any(r.endswith(":") or r.endswith("()") for r in reasons), reasons
        assert agent.alive()


def start_redis(port: int, data: str) -> subprocess.Popen[bytes]:
    """A ``redis-server`` on ``port`` that answers PING (no persistence)."""
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            data,
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        wait_for(lambda: _pings(client), 10)
    finally:
        client.close()
    return proc


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def private_redis() -> Iterator[tuple[str, int]]:
    """A ``redis-server`` of this test alone: (url, pid)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        proc = start_redis(port, data)
        try:
            yield f"redis://127.0.0.1:{port}/0", proc.pid
        finally:
            stop_redis(proc)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_a_request_pending_at_stdin_eof_is_answered_with_redis_stopped(
    monkeypatch: pytest.MonkeyPatch, private_redis: tuple[str, int]
) -> None:
    url, pid = private_redis
    with agent_on(url, monkeypatch) as agent:
        agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, STARTUP_TIMEOUT)
        os.kill(pid, signal.SIGSTOP)
        agent.send({"jsonrpc": "2.0", "id": 7, "method": "session/list", "params": {}})
        assert agent.proc.stdin is not None
        agent.proc.stdin.close()
        assert agent.proc.wait(30) == 0, agent.stderr()
        agent._reader.join(5)
        _, answer = agent.response(7, 1)
        assert answer["error"]["code"] in (STORE_UNAVAILABLE, REQUEST_CANCELLED), answer
        agent.check_clean()


def test_an_outage_and_its_recovery_are_logged_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        server = start_redis(port, data)
        try:
            with agent_on(f"redis://127.0.0.1:{port}/0", monkeypatch) as agent:
                init = {"protocolVersion": 1, "clientCapabilities": {}}
                agent.call("initialize", init, STARTUP_TIMEOUT)
                stop_redis(server)
                wait_for(lambda: relay_lines(agent), 20, message="the outage logged")
                server = start_redis(port, data)
                wait_for(
                    lambda: "subscribed again" in agent.stderr(), 40, message="the recovery logged"
                )
                lines = relay_lines(agent)
                assert len(lines) == 2, lines
                assert "lost its subscription" in lines[0] and "subscribed again" in lines[1]
                assert agent.call("session/list", {"cwd": "/nonexistent/acp"}) == {"sessions": []}
        finally:
            stop_redis(server)
