"""A full store answers 503, never 500.

The HTTP API runs as its own process (uvicorn, as ``fleet api`` serves it) against the test's
own ``EmbeddedRedis``, which is squeezed with ``maxmemory`` and ``noeviction``: a write is
refused whenever the server is over the limit, so a request that crosses the limit half-way
meets the refusal on whichever Redis call comes next, the raw ones included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from localfleet.embedded import EmbeddedRedis
from orchestrator.storage.store import Store
from tests.faults.conftest import free_port
from tests.helpers import error_shape, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

PREFIX = "full:"


@pytest.fixture
def api(private_redis: EmbeddedRedis) -> Iterator[httpx.Client]:
    """A client of the HTTP API process, no token."""
    port = free_port()
    env = dict(
        os.environ, FLEET_REDIS_URL=private_redis.url, FLEET_KEY_PREFIX=PREFIX, FLEET_API_TOKEN=""
    )
    cmd = [sys.executable, "-m", "uvicorn", "api.rest:create_app", "--factory"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
            wait_for(lambda: _answers(client), timeout=30, message="the API to listen")
            yield client
            assert proc.poll() is None, "the API process exited"
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def _squeeze(store: Store, headroom: int) -> None:
    """Let Redis take ``headroom`` more bytes than it holds now, then refuse writes."""
    store.redis.config_set("maxmemory", "0")
    used = int(store.redis.info("memory")["used_memory"])
    store.redis.config_set("maxmemory-policy", "noeviction")
    store.redis.config_set("maxmemory", str(used + headroom))


def test_a_full_store_answers_503_on_prompt_and_archive_and_recovers_without_restarts(
    private_redis: EmbeddedRedis, api: httpx.Client
) -> None:
    store = Store(private_redis.url, PREFIX)
    try:
        # Given sessions (one with a turn, so archive with stop has something to stop)
        def new_session() -> str:
            resp = api.post("/sessions", json={"cwd": "/tmp/full"})
            assert resp.status_code == 201, resp.text
            sid: str = resp.json()["sessionId"]
            return sid

        busy, idle = new_session(), new_session()
        assert api.post(f"/sessions/{busy}/prompt", json={"prompt": "think 60"}).status_code == 202
        # When Redis fills up while prompts arrive, at ten different moments of the requests
        answered: list[int] = []
        for _ in range(10):
            store.redis.config_set("maxmemory", "0")
            sid = new_session()
            _squeeze(store, 100_000)
            for _ in range(60):
                resp = api.post(f"/sessions/{sid}/prompt", json={"prompt": "say " + "x" * 4000})
                answered.append(resp.status_code)
                if resp.status_code != 202:
                    break
            # Then each prompt is accepted or refused with the documented unavailable error
            error_shape(resp, 503, "store_unavailable")
            # ... and so is an archive, with or without stopping the work, once Redis is full
            store.redis.config_set("maxmemory", "1")
            for target, body in ((idle, {}), (busy, {"stopActivity": True})):
                resp = api.post(f"/sessions/{target}/archive", json=body)
                error_shape(resp, 503, "store_unavailable")
        assert 500 not in answered
        # When memory is available again; no process is restarted
        store.redis.config_set("maxmemory", "0")
        # Then the same API prompts and archives
        sid = new_session()
        assert api.post(f"/sessions/{sid}/prompt", json={"prompt": "say hi"}).status_code == 202
        for target, body in ((idle, {}), (busy, {"stopActivity": True})):
            resp = api.post(f"/sessions/{target}/archive", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["outcome"] == "archived", resp.text
    finally:
        store.redis.config_set("maxmemory", "0")
        store.close()
