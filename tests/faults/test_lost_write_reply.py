"""A write whose reply is lost: the API's connection to Redis is reset after the script that
creates a session or a turn was sent and ran, before its reply came back (a proxy of the
tests' own between a real ``fleet api`` process and Redis cuts it when it sees the script's
``EVALSHA``). The API cannot know the outcome: it answers 503 ``write_outcome_unknown``, and a
retry with the same ``Idempotency-Key`` answers what the first request did, running nothing
twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.families import Family
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn.turns import TurnState, get_turn
from tests.api_process import ApiProcess, api_process
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import error_shape, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def turns_fleet(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "lostreply", [Family.TURN], {}
    ) as f:
        yield f


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    """A ``TcpProxy`` to the test Redis."""
    with TcpProxy.before_redis(redis_url) as found:
        yield found


def _env(proxy: TcpProxy, fleet: PrivateFleet) -> dict[str, str]:
    """The environment of a process on the private fleet's prefix whose every Redis
    connection (state and broker) goes through ``proxy``."""
    return {"FLEET_REDIS_URL": proxy.url, "FLEET_KEY_PREFIX": fleet.store.keys.prefix}


@pytest.fixture
def proxied_api(
    turns_fleet: PrivateFleet, tmp_path: Path, proxy: TcpProxy
) -> Iterator[tuple[ApiProcess, TcpProxy]]:
    """A ``fleet api`` process whose Redis connections go through ``proxy``."""
    with api_process(tmp_path / "api.log", **_env(proxy, turns_fleet)) as api:
        yield api, proxy


def _fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``fleet`` command line with ``env`` on top of the tests' environment."""
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _script_sha(store: Store, name: str) -> bytes:
    """The digest the API's ``EVALSHA`` of script ``name`` carries, the script loaded on the
    server (so the cut request is the one that runs it, not a ``NOSCRIPT`` refusal)."""
    script = store.script(name)
    store.redis.script_load(script.script)
    return str(script.sha).encode()


def _lost_reply(resp: httpx.Response) -> dict[str, Any]:
    error = error_shape(resp, 503, "write_outcome_unknown")
    assert error["data"]["outcome"] == "unknown" and error["data"]["idempotencyKey"] is True
    assert "may have been applied" in error["message"], error
    assert "same idempotency key" in error["message"], error
    return error


def test_a_session_created_whose_reply_was_lost_is_answered_once_on_retry(
    proxied_api: tuple[ApiProcess, TcpProxy], turns_fleet: PrivateFleet
) -> None:
    api, proxy = proxied_api
    store = turns_fleet.store
    cwd = f"/tmp/lost-reply-{uuid.uuid4().hex[:8]}"
    key = str(uuid.uuid4())
    # Given: the API's connection is reset once the create script ran, before its reply
    cut = proxy.cut_after(_script_sha(store, "create_session"))
    # When: a session is created with an idempotency key
    first = httpx.post(
        f"{api.base}/sessions", json={"cwd": cwd}, headers={"Idempotency-Key": key}, timeout=30
    )
    # Then: the API answers 503, and the session was in fact created
    assert cut.done.wait(10) and first.status_code == 503, first.text
    [made] = sessions.list_sessions(store, cwd=cwd).sessions
    # When: the client retries with the same key
    again = httpx.post(
        f"{api.base}/sessions", json={"cwd": cwd}, headers={"Idempotency-Key": key}, timeout=30
    )
    # Then: it gets that session, as a creation answers, and no other was created
    assert again.status_code == 201, again.text
    assert again.json()["sessionId"] == made.session_id
    assert [s.session_id for s in sessions.list_sessions(store, cwd=cwd).sessions] == [
        made.session_id
    ]
    # And the 503 said the creation may have been applied, and how to retry safely
    _lost_reply(first)
    # And the key with another request is refused, nothing created
    other = httpx.post(
        f"{api.base}/sessions",
        json={"cwd": cwd + "-other"},
        headers={"Idempotency-Key": key},
        timeout=30,
    )
    error_shape(other, 422, "idempotency_key_reused")
    assert sessions.list_sessions(store, cwd=cwd + "-other").sessions == []


def test_a_prompt_whose_reply_was_lost_runs_its_turn_once_on_retry(
    proxied_api: tuple[ApiProcess, TcpProxy], turns_fleet: PrivateFleet
) -> None:
    api, proxy = proxied_api
    store = turns_fleet.store
    sid = sessions.create_session(store, f"/tmp/lost-reply-{uuid.uuid4().hex[:8]}").session_id
    key = str(uuid.uuid4())
    url = f"{api.base}/sessions/{sid}/prompt"
    # Given: the API's connection is reset once the turn's script ran, before its reply
    cut = proxy.cut_after(_script_sha(store, "turn_create"))
    # When: a prompt is sent with an idempotency key
    first = httpx.post(
        url, json={"prompt": "say once"}, headers={"Idempotency-Key": key}, timeout=30
    )
    # Then: the API answers 503, and the turn was in fact stored
    assert cut.done.wait(10) and first.status_code == 503, first.text
    [stored] = store.redis.zrange(store.keys.live_turns(sid), 0, -1)
    # When: the client retries with the same key
    again = httpx.post(
        url, json={"prompt": "say once"}, headers={"Idempotency-Key": key}, timeout=30
    )
    # Then: it is answered with that turn, which runs to its end once
    assert again.status_code == 202, again.text
    assert again.json() == {"sessionId": sid, "turnId": stored}
    wait_for(
        lambda: (t := get_turn(store, stored)) is not None and t.state is TurnState.COMPLETED,
        timeout=60,
        message="the turn to complete",
    )
    assert store.redis.zcard(store.keys.live_turns(sid)) == 0
    requests = [json.loads(r) for r in store.redis.lrange(store.keys.model_requests(sid), 0, -1)]
    assert [r["turnId"] for r in requests] == [stored], requests
    said = [
        json.loads(u)
        for u in store.redis.lrange(store.keys.history(sid), 0, -1)
        if json.loads(u).get("sessionUpdate") == "user_message_chunk"
    ]
    assert len(said) == 1, said
    # And the 503 said the prompt may have been applied, and how to retry safely
    _lost_reply(first)
    # And the key with another prompt is refused, nothing stored
    other = httpx.post(
        url, json={"prompt": "say twice"}, headers={"Idempotency-Key": key}, timeout=30
    )
    error_shape(other, 422, "idempotency_key_reused")
    assert store.redis.zcard(store.keys.live_turns(sid)) == 0


def test_fleet_sessions_new_retries_a_lost_reply_with_its_key(
    proxy: TcpProxy, turns_fleet: PrivateFleet
) -> None:
    store = turns_fleet.store
    cwd = f"/tmp/lost-reply-cli-{uuid.uuid4().hex[:8]}"
    # Given: the command's connection is reset once the create script ran
    cut = proxy.cut_after(_script_sha(store, "create_session"))
    # When: a session is created with the command line
    done = _fleet(_env(proxy, turns_fleet), "sessions", "new", cwd, "--json")
    # Then: it retried with its key and printed the one session created
    assert cut.done.wait(10)
    assert done.returncode == 0, done.stderr
    [made] = sessions.list_sessions(store, cwd=cwd).sessions
    assert json.loads(done.stdout)["sessionId"] == made.session_id


def test_fleet_prompt_retries_a_lost_reply_with_its_key_and_the_turn_runs_once(
    proxy: TcpProxy, turns_fleet: PrivateFleet
) -> None:
    store = turns_fleet.store
    sid = sessions.create_session(store, f"/tmp/lost-reply-cli-{uuid.uuid4().hex[:8]}").session_id
    # Given: the command's connection is reset once the turn's script ran
    cut = proxy.cut_after(_script_sha(store, "turn_create"))
    # When: a prompt is sent with the command line, which follows its turn
    done = _fleet(_env(proxy, turns_fleet), "prompt", sid, "say once")
    # Then: it retried with its key, and the one turn stored ran once to its end
    assert cut.done.wait(10)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "once"
    requests = [json.loads(r) for r in store.redis.lrange(store.keys.model_requests(sid), 0, -1)]
    assert len({r["turnId"] for r in requests}) == 1, requests
