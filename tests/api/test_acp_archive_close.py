"""What an archive tells the clients that have a session open, over real ACP connections
(two ``fleet acp`` processes) and the REST API's ``/events``.

- Every session an archive transition changes gets its ``session_info_update`` and its event:
  archiving a parent tells a client that has its child open, on archive and on unarchive,
  and ``/events?sessionId=<child>`` shows the child's events.
- Archive closes the session on every connection that had it open, "as if session/close had
  been called": after the archive and a later unarchive, a turn prompted from REST
  sends those clients nothing, until a client loads or resumes it.

Absence is checked against a sentinel: a connection handles its events in publish order, so
once a later event of another session has reached it, nothing of the session came before.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import api.rest
from orchestrator.session import sessions as session_ops
from tests.api.test_acp_stdio import (
    PROMPT_TIMEOUT,
    RpcPeer,
    StdioAgent,
    agent_texts,
    new_session,
    stdio_agent,
    text_prompt,
)
from tests.helpers import wait_for

ARCHIVED = {"sessionUpdate": "session_info_update", "archived": True}
UNARCHIVED = {"sessionUpdate": "session_info_update", "archived": False}


@pytest.fixture(scope="module")
def first() -> Iterator[StdioAgent]:
    with stdio_agent("first") as agent:
        yield agent


@pytest.fixture(scope="module")
def second() -> Iterator[StdioAgent]:
    with stdio_agent("second") as agent:
        yield agent


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(api.rest.create_app()) as c:
        yield c


@pytest.fixture
def cwd() -> str:
    return f"/tmp/fleet-acp-archive-close/{uuid.uuid4().hex}"


def _last_event_id(store: Any) -> str:
    newest = store.redis.xrevrange(store.keys.event_stream, count=1)
    return str(newest[0][0]) if newest else "0-0"


def _events(
    client: TestClient, sid: str, after: str, kinds: set[str], count: int
) -> list[dict[str, Any]]:
    """The first ``count`` events of ``sid`` of the ``kinds`` on ``GET /events`` after event
    ``after``."""
    found: list[dict[str, Any]] = []
    params = {"sessionId": sid, "lastEventId": after}
    with client.stream("GET", "/events", params=params) as resp:
        assert resp.status_code == 200, resp.read()
        kind = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                kind = line.partition(":")[2].strip()
            elif line.startswith("data:") and kind in kinds:
                found.append(json.loads(line.partition(":")[2]))
                if len(found) == count:
                    return found
    raise AssertionError(f"the event stream ended after {found}")


def _sentinel(peer: RpcPeer, sentinel: str, title: str) -> None:
    """Wait until ``peer`` has handled an event published now (a title of ``sentinel``)."""
    peer.call("session/set_title", {"sessionId": sentinel, "title": title})
    peer.wait_update(sentinel, lambda u: u.get("title") == title)


def _updates_since(peer: RpcPeer, sid: str, mark: int) -> list[dict[str, Any]]:
    return [u for i, u in peer.updates(sid) if i >= mark]


def test_archiving_a_parent_tells_a_client_with_its_child_open_and_events_name_the_child(
    first: StdioAgent, second: StdioAgent, client: TestClient, store: Any, fleet: Any, cwd: str
) -> None:
    # Given a parent open on one connection and its subagent session prompted on another
    parent = new_session(first, cwd)
    child = session_ops.create_session(store, cwd, parent_id=parent).session_id
    second.call("session/resume", {"sessionId": child, "cwd": cwd})
    rid = second.request_async("session/prompt", text_prompt(child, "think 30"))
    second.wait_update(child, lambda u: u["sessionUpdate"] == "user_message_chunk")
    before = _last_event_id(store)
    # When the parent is archived, then unarchived
    assert first.call("session/archive", {"sessionId": parent}) == {}
    # Then the child's client is told it is archived before its work ends
    info_at, _ = second.wait_update(child, lambda u: u == ARCHIVED)
    answer_at, answer = second.response(rid)
    assert answer["result"] == {"stopReason": "cancelled"}, answer
    assert info_at < answer_at
    first.wait_update(parent, lambda u: u == ARCHIVED)
    # And that it is not archived any more after the unarchive
    assert first.call("session/unarchive", {"sessionId": parent}) == {}
    second.wait_update(child, lambda u: u == UNARCHIVED)
    first.wait_update(parent, lambda u: u == UNARCHIVED)
    # And /events shows the child's own events of both transitions
    events = _events(client, child, before, {"archived", "unarchived"}, 2)
    assert [(e["type"], e["sessionId"], e["archived"]) for e in events] == [
        ("archived", child, True),
        ("unarchived", child, False),
    ]


def test_archive_closes_the_session_on_every_connection_until_it_is_loaded_again(
    first: StdioAgent, second: StdioAgent, client: TestClient, fleet: Any, cwd: str
) -> None:
    # Given a session open on two connections (each also has a sentinel session open)
    sid = new_session(first, cwd)
    second.call("session/resume", {"sessionId": sid, "cwd": cwd})
    sentinels = {first: new_session(first, cwd), second: new_session(second, cwd)}
    mark = {peer: peer.mark() for peer in (first, second)}
    # When the first connection archives it and unarchives it
    assert first.call("session/archive", {"sessionId": sid}) == {}
    assert first.call("session/unarchive", {"sessionId": sid}) == {}
    # And a turn is prompted on it from REST and ends
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say from rest"})
    assert resp.status_code == 202, resp.text
    tid = resp.json()["turnId"]
    wait_for(lambda: client.get(f"/turns/{tid}").json()["state"] == "completed", PROMPT_TIMEOUT)
    # Then both connections were told archived, then unarchived, and sent nothing else
    for peer in (first, second):
        _sentinel(peer, sentinels[peer], "after the rest turn")
        assert _updates_since(peer, sid, mark[peer]) == [ARCHIVED, UNARCHIVED], peer.name
    # When a client loads it again, its conversation is replayed and live updates flow again
    second.call("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []})
    assert agent_texts(second, sid) == ["from rest"]
    mark_first = first.mark()
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say again"})
    tid = resp.json()["turnId"]
    wait_for(lambda: client.get(f"/turns/{tid}").json()["state"] == "completed", PROMPT_TIMEOUT)
    second.wait_update(sid, lambda u: u.get("content", {}).get("text") == "again")
    # But not to the connection that did not load it
    _sentinel(first, sentinels[first], "after the second rest turn")
    assert _updates_since(first, sid, mark_first) == []
