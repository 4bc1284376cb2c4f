"""A ``session/cancel`` (or ``$/cancel_request``) that reaches the agent after the client saw
its prompt's turn begin, but before the prompt tracked that turn, still stops it
(``api/acp/prompts.py``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from api.acp import handlers
from api.acp import params as p
from api.acp.prompts import Prompts
from orchestrator.session import sessions
from tests.helpers import RecordingDispatcher


async def _track(prompts: Prompts, sid: str, tid: str) -> None:
    prompts.track(sid, tid)


def test_a_cancel_before_the_turn_is_tracked_is_taken_by_that_prompt_once() -> None:
    # Given two prompts begun on a session, one tracked, one not yet
    prompts = Prompts()
    prompts.begin("s")
    prompts.begin("s")
    asyncio.run(_track(prompts, "s", "t1"))
    # When the client cancels its prompts on it
    # Then the tracked turn is stopped now and the other prompt learns it once it tracks
    assert prompts.cancel("s") == ["t1"]
    assert prompts.take_cancel("s") is True
    assert prompts.take_cancel("s") is False


def test_a_cancel_with_every_prompt_tracked_or_none_begun_marks_nothing() -> None:
    prompts = Prompts()
    assert prompts.cancel("s") == []
    assert prompts.take_cancel("s") is False


def test_a_prompt_that_never_got_a_turn_spends_its_cancel() -> None:
    # Given a cancel counted for a prompt whose turn was never started (it failed)
    prompts = Prompts()
    prompts.begin("s")
    prompts.cancel("s")
    prompts.finish("s", None)
    # When a later prompt begins and tracks its turn
    prompts.begin("s")
    # Then it is not cancelled by the earlier cancel
    assert prompts.take_cancel("s") is False


class _Streams:
    async def open_session(self, sid: str) -> None:
        return None

    def inject(self, event: dict[str, Any]) -> None:
        return None

    def release(self, sid: str) -> None:
        return None


class _Conn:
    """What ``handlers.prompt`` and ``handlers.cancel`` use of a connection; a cancelled turn
    settles its prompt as the forwarder would."""

    def __init__(self, store: Any) -> None:
        self.store, self.dispatcher = store, RecordingDispatcher()
        self.prompts, self.streams = Prompts(), _Streams()
        self.cancelled: list[tuple[str, list[str] | None]] = []

    async def cancel_turns(self, sid: str, turn_ids: list[str] | None = None) -> int:
        self.cancelled.append((sid, turn_ids))
        for tid in turn_ids or []:
            self.prompts.settle(tid, "cancelled")
        return len(turn_ids or [])


def test_a_session_cancel_while_the_turn_is_being_started_stops_that_turn(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = sessions.create_session(store, "/tmp/acp-early-cancel").session_id
    entered, release = threading.Event(), threading.Event()

    def slow_start_turn(*args: Any, **kwargs: Any) -> str:
        entered.set()  # the turn is stored: the client may see it begin from here on
        assert release.wait(30)
        return "turn_early"

    monkeypatch.setattr(handlers.turns, "start_turn", slow_start_turn)
    conn = _Conn(store)
    request = p.schema.PromptRequest.model_validate(
        {"sessionId": sid, "prompt": [{"type": "text", "text": "think 30"}]}
    )

    async def scenario() -> dict[str, Any]:
        # Given a prompt whose turn is being started
        pending = asyncio.create_task(handlers.prompt(conn, request))  # type: ignore[arg-type]
        assert await asyncio.to_thread(entered.wait, 30)
        # When the client's session/cancel arrives before the prompt tracked the turn
        cancel = p.schema.CancelNotification.model_validate({"sessionId": sid})
        await handlers.cancel(conn, cancel)  # type: ignore[arg-type]
        release.set()
        return await asyncio.wait_for(pending, 30)

    # Then that turn is stopped once it is tracked, and the prompt answers cancelled
    assert asyncio.run(scenario()) == {"stopReason": "cancelled"}
    assert conn.cancelled[-1] == (sid, ["turn_early"])


def test_a_retried_prompt_waiting_beside_the_first_ends_with_it(store: Any) -> None:
    # Given a prompt with an idempotency key still waiting on its turn
    sid = sessions.create_session(store, "/tmp/acp-keyed-retry").session_id
    conn = _Conn(store)
    request = p.schema.PromptRequest.model_validate(
        {
            "sessionId": sid,
            "prompt": [{"type": "text", "text": "say once"}],
            "_meta": {"agentFleet": {"idempotencyKey": "acp-retry-1"}},
        }
    )

    async def scenario() -> list[dict[str, Any]]:
        first = asyncio.create_task(handlers.prompt(conn, request))  # type: ignore[arg-type]
        while not conn.prompts.sessions():
            await asyncio.sleep(0.01)
        # When the client sends it again on the same connection before the first answers
        again = asyncio.create_task(handlers.prompt(conn, request))  # type: ignore[arg-type]
        while not store.redis.zcard(store.keys.live_turns(sid)):
            await asyncio.sleep(0.01)
        [tid] = store.redis.zrange(store.keys.live_turns(sid), 0, -1)
        while conn.prompts.waiting(tid) < 2:  # both wait on the one turn
            await asyncio.sleep(0.01)
        conn.prompts.settle(tid, "end_turn")  # the turn's end, as the forwarder reports it
        return list(await asyncio.wait_for(asyncio.gather(first, again), 30))

    # Then both answer with the one turn's end
    assert asyncio.run(scenario()) == [{"stopReason": "end_turn"}] * 2
    assert store.redis.zcard(store.keys.live_turns(sid)) == 1
    assert not conn.prompts.pending(sid)
