"""ACP has no notification for a delete: a ``deleted`` event closes the session on the
connection, silently, as ``session/close`` does (no more updates, no unarchive to wait for),
and an event of a kind the connection does not know never reaches the client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.acp.prompts import Prompts
from api.acp.stream import Streams

pytestmark = pytest.mark.unit


class _Hub:
    """What ``Streams`` uses of an ``EventHub``: who watches which session."""

    def __init__(self) -> None:
        self.watching: dict[str, int] = {}

    def watch(self, sid: str, queue: Any) -> None:
        self.watching[sid] = self.watching.get(sid, 0) + 1

    def unwatch(self, sid: str, queue: Any) -> None:
        self.watching.pop(sid, None)


def _run(events: list[dict[str, Any]], sid: str) -> tuple[Streams, _Hub, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    hub = _Hub()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def go() -> Streams:
        streams = Streams(None, hub, send, Prompts())  # type: ignore[arg-type]
        await streams.open_session(sid, 0)  # a cursor given: nothing is read
        for event in events:
            await streams._handle(event)
        return streams

    return asyncio.run(go()), hub, sent


def test_a_deleted_event_closes_the_open_session_silently() -> None:
    streams, hub, sent = _run([{"type": "deleted", "sessionId": "sess_a"}], "sess_a")
    assert "sess_a" not in streams.open
    assert "sess_a" not in hub.watching
    assert sent == []


def test_a_session_archived_then_deleted_no_longer_waits_for_its_unarchive() -> None:
    # A delete with stop archives first: the connection is told archived: true, then the
    # delete frees the session for good
    archived = {"type": "archived", "sessionId": "sess_a", "archived": True, "historyLength": 0}
    streams, hub, sent = _run([archived, {"type": "deleted", "sessionId": "sess_a"}], "sess_a")
    assert [m["params"]["update"] for m in sent] == [
        {"sessionUpdate": "session_info_update", "archived": True}
    ]
    assert "sess_a" not in hub.watching
    assert "sess_a" not in streams._archived


def test_an_unknown_event_kind_sends_nothing_and_keeps_the_session_open() -> None:
    streams, hub, sent = _run([{"type": "something-new", "sessionId": "sess_a"}], "sess_a")
    assert sent == [] and "sess_a" in streams.open and "sess_a" in hub.watching
