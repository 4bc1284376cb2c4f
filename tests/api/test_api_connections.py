"""What one client's connection may hold of the API process, tried on a real ``fleet api``
over real sockets: ``GET /events`` streams (each holds a Redis connection) are capped per
process by ``FLEET_API_MAX_EVENT_STREAMS``, one more answering 503 ``too_many_streams`` before
it opens a Redis connection, so however many streams clients open, the process's Redis
clients stay bounded and Redis's ``maxclients`` is never reached for the whole fleet; a
connection that never finishes its request head (slowloris) is closed after ``fleet api
--head-timeout`` seconds, while requests whose head came in full (a WebSocket, a
stream) run on."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from websockets.sync.client import connect

from localfleet.embedded import EmbeddedRedis
from tests.api_process import ApiProcess, api_process
from tests.helpers import wait_for

pytestmark = pytest.mark.redis

STREAM_LIMIT = 5
HEAD_TIMEOUT = 1.0
#: How long the server may take past ``HEAD_TIMEOUT`` to close (a loaded 2-core box).
CLOSE_BOUND = 15.0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of this test alone, so its CLIENT LIST counts this API process's clients only."""
    server = EmbeddedRedis(tmp_path / "state")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _clients(client: redis.Redis) -> int:
    """Clients connected to Redis, this test's own connection left out."""
    listed = client.client_list()
    me = client.client_id()
    return sum(1 for c in listed if int(c["id"]) != me)


def _open_stream(api: ApiProcess) -> tuple[socket.socket, bytes]:
    """A ``GET /events`` on a socket of its own: the socket, and the answer's first bytes
    (through ``: connected`` for a stream, the whole head and body for a refusal)."""
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=30)
    sock.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    got = b""
    while b": connected" not in got and not (b"HTTP/1.1 503" in got and got.endswith(b"}")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return sock, got


def test_event_streams_past_the_cap_answer_503_and_redis_clients_stay_bounded(
    tmp_path: Path, own_redis: EmbeddedRedis
) -> None:
    # Given an API process on a Redis of its own, capped at 5 streams
    with (
        api_process(
            tmp_path / "api.log",
            FLEET_REDIS_URL=own_redis.url,
            FLEET_API_MAX_EVENT_STREAMS=str(STREAM_LIMIT),
        ) as api,
        redis.Redis.from_url(own_redis.url) as probe,
    ):
        sock, first = _open_stream(api)  # the process's other connections are made by now
        assert first.startswith(b"HTTP/1.1 200"), first
        with_one = _clients(probe)
        sock.close()
        wait_for(lambda: _clients(probe) < with_one, 20, message="the first stream's client gone")
        base = _clients(probe)
        # When clients open 30 streams at once
        opened = [_open_stream(api) for _ in range(30)]
        try:
            served = [s for s, got in opened if b": connected" in got]
            refused = [got for _, got in opened if got.startswith(b"HTTP/1.1 503")]
            # Then 5 are served and 25 refused 503 too_many_streams with Retry-After
            assert (len(served), len(refused)) == (STREAM_LIMIT, 25), [g[:40] for _, g in opened]
            head, _, body = refused[0].partition(b"\r\n\r\n")
            assert b"retry-after: 5" in head.lower(), head
            error = json.loads(body)["error"]
            assert error["code"] == "too_many_streams", error
            assert error["data"] == {"limit": STREAM_LIMIT}, error
            assert "FLEET_API_MAX_EVENT_STREAMS" in error["message"], error
            # And the process holds no more Redis clients than the streams it serves
            assert _clients(probe) - base <= STREAM_LIMIT, (base, probe.client_list())
        finally:
            for s, _ in opened:
                s.close()
        # And once those clients leave, their places and connections are given back
        wait_for(lambda: _clients(probe) <= base, 20, message="the streams' clients closed")
        again = [_open_stream(api) for _ in range(STREAM_LIMIT)]
        assert all(b": connected" in got for _, got in again), [g[:40] for _, g in again]
        for s, _ in again:
            s.close()


def _closed_within(sock: socket.socket, bound: float) -> float | None:
    """Seconds until the server closed ``sock`` (reading whatever it sends), ``None`` if it
    is still open after ``bound`` seconds."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < bound:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
    return None


def test_a_request_head_never_finished_is_closed_within_the_bound(tmp_path: Path) -> None:
    # Given the API with a 1 s request-head deadline
    with api_process(tmp_path / "api.log", args=["--head-timeout", str(HEAD_TIMEOUT)]) as api:
        # When a client sends part of a request line and then nothing
        partial = socket.create_connection(("127.0.0.1", api.port), timeout=10)
        partial.sendall(b"GET /sessions HTT")
        # Then the server closes the connection within the bound
        took = _closed_within(partial, CLOSE_BOUND)
        partial.close()
        assert took is not None and took >= HEAD_TIMEOUT * 0.8, took
        # And so it does for one that trickles header bytes, each in time for the last
        trickle = socket.create_connection(("127.0.0.1", api.port), timeout=10)
        trickle.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        start, closed = time.monotonic(), False
        while time.monotonic() - start < CLOSE_BOUND and not closed:
            try:
                trickle.sendall(b"a")
            except OSError:
                closed = True
                break
            closed = _closed_within(trickle, 0.3) is not None
        trickle.close()
        assert closed, "a trickled request head was never cut"


def test_requests_whose_head_came_run_past_the_head_deadline(tmp_path: Path) -> None:
    with api_process(tmp_path / "api.log", args=["--head-timeout", str(HEAD_TIMEOUT)]) as api:
        # Given an /acp WebSocket and an event stream open for longer than the deadline
        stream, first = _open_stream(api)
        assert b": connected" in first, first
        with connect(f"ws://127.0.0.1:{api.port}/acp", open_timeout=10) as ws:
            deadline = time.monotonic() + HEAD_TIMEOUT * 3
            while time.monotonic() < deadline:
                ws.ping().wait(5)
            # Then the WebSocket still answers
            ws.send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}')
            assert json.loads(ws.recv(timeout=10))["result"]["protocolVersion"] == 1
        # And the stream is still open (nothing read from it ended it)
        assert _closed_within(stream, 0.5) is None
        stream.close()
