"""``_meta.agentFleet.idempotencyKey`` on ACP ``session/new`` and ``session/prompt`` (a real
``fleet acp`` process, real workers for the prompts): a retry with the key answers what the
first request did and runs nothing twice."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.session import sessions
from orchestrator.storage.store import Store
from tests.api.test_acp_stdio import (
    INVALID_PARAMS,
    PROMPT_TIMEOUT,
    StdioAgent,
    new_session,
    stdio_agent,
    text_prompt,
)
from tests.workers.support import model_requests


@pytest.fixture(scope="module")
def agent() -> Iterator[StdioAgent]:
    with stdio_agent("idem-agent") as a:
        yield a


def _keyed(params: dict[str, Any], key: Any) -> dict[str, Any]:
    return {**params, "_meta": {"agentFleet": {"idempotencyKey": key}}}


def _cwd() -> str:
    return f"/tmp/fleet-acp-idem/{uuid.uuid4().hex}"


def test_session_new_retried_with_its_key_answers_the_same_session(
    agent: StdioAgent, store: Store
) -> None:
    cwd, key = _cwd(), str(uuid.uuid4())
    params = _keyed({"cwd": cwd, "mcpServers": []}, key)
    first = agent.call("session/new", params)
    again = agent.call("session/new", params)
    assert again == first
    assert [s.session_id for s in sessions.list_sessions(store, cwd=cwd).sessions] == [
        first["sessionId"]
    ]
    # The key with another cwd is refused, nothing created.
    other = _keyed({"cwd": cwd + "-2", "mcpServers": []}, key)
    error = agent.error("session/new", other, INVALID_PARAMS)
    assert error["data"] == {"param": "idempotencyKey"}
    assert sessions.list_sessions(store, cwd=cwd + "-2").sessions == []


@pytest.mark.parametrize("bad", ["", "with space", "k" * 256, 7, None])
def test_a_malformed_key_is_invalid_params(agent: StdioAgent, store: Store, bad: Any) -> None:
    cwd = _cwd()
    error = agent.error("session/new", _keyed({"cwd": cwd, "mcpServers": []}, bad), INVALID_PARAMS)
    assert error["data"]["param"] == "idempotencyKey", error
    assert sessions.list_sessions(store, cwd=cwd).sessions == []


def test_session_prompt_retried_with_its_key_runs_the_turn_once(
    agent: StdioAgent, store: Store, fleet: Any
) -> None:
    sid = new_session(agent, _cwd())
    params = _keyed(text_prompt(sid, "say once"), str(uuid.uuid4()))
    assert agent.call("session/prompt", params, PROMPT_TIMEOUT) == {"stopReason": "end_turn"}
    # The retry follows the turn the first started (ended by now) and starts none.
    assert agent.call("session/prompt", params, PROMPT_TIMEOUT) == {"stopReason": "end_turn"}
    assert len({r["turnId"] for r in model_requests(store, sid)}) == 1
    # The key with another prompt is refused.
    other = _keyed(text_prompt(sid, "say twice"), params["_meta"]["agentFleet"]["idempotencyKey"])
    agent.error("session/prompt", other, INVALID_PARAMS)
    assert len(model_requests(store, sid)) == 1
