"""An idle ``GET /events`` client against a healthy Redis: the blocking
``XREAD`` must not time out on its own ``BLOCK``, so the stream carries no "store
unavailable" comment and the API logs no warning while nothing happens.

The heartbeat is set longer than redis-py's default socket timeout (5 s), so a read that
blocks until the heartbeat is due is longer than one socket timeout; the test waits for that
heartbeat (bounded by the test's timeout) and checks what came before it."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from tests.helpers import rest_client

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

#: Longer than redis-py's default socket timeout of 5 s.
HEARTBEAT = 6.5


def _idle_session(client: TestClient) -> str:
    sid: str = client.post("/sessions", json={"cwd": "/tmp/fleet-events-idle"}).json()["sessionId"]
    return sid


def test_an_idle_event_stream_gets_heartbeats_and_no_store_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    comments: list[str] = []
    with (
        caplog.at_level(logging.WARNING),
        rest_client(sse_heartbeat_seconds=HEARTBEAT) as client,
        client.stream("GET", "/events", params={"sessionId": _idle_session(client)}) as resp,
    ):
        assert resp.status_code == 200
        # Wait for the first heartbeat: by then each read has blocked longer than a socket
        # timeout would allow.
        for line in resp.iter_lines():
            if line.startswith(":"):
                comments.append(line[1:].strip())
                if comments[-1] in ("heartbeat", "ping"):
                    break
    assert comments == ["connected", "heartbeat"], comments
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [], warnings
