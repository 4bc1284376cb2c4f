"""A conversation holding JSON nested deeper than any reader could walk (a model's tool
arguments, stored before they were bounded) still reads: ``GET /sessions/{id}/conversation``
answers 200, ACP ``session/load`` replays it, and the next model step sees it, each with the
over-deep part cut (``orchestrator.untrusted.stored``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import api.rest
from orchestrator import untrusted
from orchestrator.models import chat
from orchestrator.session.sessions import create_session
from orchestrator.storage.store import Store
from tests.api.test_acp_websocket import acp_socket
from tests.helpers import rest_client

pytestmark = [pytest.mark.redis]


def _tool_call(depth: int) -> str:
    """A stored ``tool_call`` update whose ``rawInput`` is ``depth`` arrays deep."""
    head = {
        "sessionUpdate": "tool_call",
        "turnId": "turn_old",
        "toolCallId": f"call_{depth}",
        "title": "shell",
        "kind": "execute",
        "status": "in_progress",
        "_meta": {"agentFleet": {"tool": "shell"}},
    }
    return json.dumps(head)[:-1] + ', "rawInput": ' + "[" * depth + "]" * depth + "}"


@pytest.fixture
def deep_session(store: Store) -> Iterator[str]:
    sid = create_session(store, f"/tmp/fleet-deep/{uuid.uuid4().hex}").session_id
    said = {"sessionUpdate": "agent_message_chunk", "turnId": "turn_old"}
    said["content"] = {"type": "text", "text": "after the deep calls"}  # type: ignore[assignment]
    store.redis.rpush(
        store.keys.history(sid), _tool_call(300), _tool_call(100_000), json.dumps(said)
    )
    yield sid


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest


def test_the_conversation_get_answers_with_the_over_deep_parts_cut(
    store: Store, deep_session: str
) -> None:
    with rest_client(store=store) as client:
        answer = client.get(f"/sessions/{deep_session}/conversation")

    assert answer.status_code == 200, answer.text
    shallow, deep, said = answer.json()["updates"]
    for call in (shallow, deep):
        assert _depth(call["rawInput"]) <= untrusted.STORED_MAX_DEPTH
        assert untrusted.CUT in json.dumps(call["rawInput"])
    assert said["content"]["text"] == "after the deep calls"


def test_acp_session_load_replays_the_conversation(store: Store, deep_session: str) -> None:
    with TestClient(api.rest.create_app()) as client, acp_socket(client, "deep") as peer:
        params = {"sessionId": deep_session, "cwd": "/tmp", "mcpServers": []}
        assert peer.call("session/load", params) == {}
        kinds = [u["sessionUpdate"] for _, u in peer.updates(deep_session)]
        assert kinds == ["tool_call", "tool_call", "agent_message_chunk"]


def test_the_next_model_step_sees_the_conversation(store: Store, deep_session: str) -> None:
    messages = chat.conversation(store, deep_session)

    [calls, *results, said] = messages
    assert [c.call_id for c in calls.tool_calls] == ["call_300", "call_100000"]
    assert untrusted.CUT in calls.tool_calls[1].arguments
    assert said.text == "after the deep calls"
