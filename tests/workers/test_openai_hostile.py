"""Hostile model output on real turn workers: a fixture server of the tests' own
(``tests/openai_server.py``) answers through the official SDK with streams that are not JSON,
chunks of the wrong shapes, tool arguments nested 300 and 100,000 deep or megabytes long, an
endless answer and token counts that are no counts. Each ends its step once (the server's log
counts the requests), with a tool error the model sees or a ``failed`` turn naming the true
reason; what is stored stays bounded, and the conversation still reads (200).

The fleet sweeps every second for turns stuck 3 s, so a step that crashed would be resumed
(and ask the server again) within the test's wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.storage import metrics
from tests.faults.fleets import PrivateFleet, sweeping
from tests.helpers import rest_client, wait_for
from tests.openai_server import Served, serve
from tests.workers.openai_fleet import (
    FIXTURES,
    ended,
    new_turn,
    openai_fleet,
    result_text,
    said,
    updates_of,
)

pytestmark = [pytest.mark.redis, pytest.mark.integration, pytest.mark.timeout(120)]

TEXT_MAX = 65_536
ARGUMENTS_MAX = 262_144  # the default


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(FIXTURES, tmp_path_factory.mktemp("openai") / "requests.jsonl") as served:
        yield served


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: Any, server: Served
) -> Iterator[PrivateFleet]:
    env = sweeping(3, FLEET_MODEL_TEXT_MAX_BYTES=str(TEXT_MAX))
    with openai_fleet(redis_url, key_prefix, tmp_path_factory, "hostile", server, 3, 2, **env) as f:
        yield f


def _conversation(private: PrivateFleet, sid: str) -> list[dict[str, Any]]:
    """The session's conversation as ``GET /sessions/{id}/conversation`` answers it (200)."""
    with rest_client(store=private.store, dispatcher=private.dispatcher) as client:
        answer = client.get(f"/sessions/{sid}/conversation", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    updates: list[dict[str, Any]] = answer.json()["updates"]
    return updates


def _tool_error(private: PrivateFleet, sid: str, tid: str) -> str:
    """The result of the turn's one tool call, which failed."""
    [update] = updates_of(private, sid, tid, "tool_call_update")
    assert update["status"] == "failed"
    return result_text(update)


def _stored_bytes(private: PrivateFleet, sid: str) -> int:
    key = private.store.keys.history(sid)
    return sum(len(item.encode()) for item in private.store.redis.lrange(key, 0, -1))


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("notjson", "JSONDecodeError"),
        ("deepchunk", "RecursionError"),
        ("badshape", "content is a list, not a string"),
    ],
)
def test_a_malformed_stream_fails_the_turn_once_with_what_was_wrong(
    private: PrivateFleet, server: Served, tmp_path: Path, model: str, why: str
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, model)

    turn = ended(private, tid)

    assert turn.state.value == "failed"
    assert "malformed answer" in turn.error and why in turn.error
    assert "lost" not in turn.error
    assert len(server.records(prompt=prompt)) == 1
    assert _conversation(private, sid)[-1]["content"]["text"].startswith("error: ")


@pytest.mark.parametrize("model", ["deepargs", "deep300"])
def test_over_deep_tool_arguments_are_a_tool_error_the_model_sees(
    private: PrivateFleet, server: Served, tmp_path: Path, model: str
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, model)

    turn = ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "end_turn")
    assert "nested deeper than 64 levels" in _tool_error(private, sid, tid)
    first, second = server.records(prompt=prompt)
    assert "nested deeper than 64 levels" in second["messages"][-1]["content"]
    [call] = [u for u in _conversation(private, sid) if u["sessionUpdate"] == "tool_call"]
    assert isinstance(call["rawInput"], str)  # kept as text, not as 300 levels of JSON
    assert said(private, sid, tid) == "I will nest less."


def test_an_oversized_tool_argument_stops_the_request_and_is_a_tool_error(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    # Given a model whose tool call's arguments are 8 MiB (the bound: 256 KiB)
    sid, tid, prompt = new_turn(private, tmp_path, "bigargs")

    turn = ended(private, tid)

    # Then the request was stopped (the server saw the close before it sent them all), the
    # call is a tool error the model sees, and the conversation stores a few KiB of it
    assert turn.state.value == "completed"
    assert server.records("closed", prompt)
    assert f"more than {ARGUMENTS_MAX} bytes" in _tool_error(private, sid, tid)
    assert len(server.records(prompt=prompt)) == 2
    assert _stored_bytes(private, sid) < 16_384
    assert len(_conversation(private, sid)) == 5


def test_an_endless_answer_fails_the_turn_at_the_text_bound(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "endless")

    turn = ended(private, tid)

    assert turn.state.value == "failed"
    assert f"passed {TEXT_MAX} bytes" in turn.error and "FLEET_MODEL_TEXT_MAX_BYTES" in turn.error
    wait_for(lambda: server.records("closed", prompt), 10, message="the server to see the close")
    assert len(server.records(prompt=prompt)) == 1
    text = said(private, sid, tid)
    assert len(text.encode()) <= TEXT_MAX + 1024  # the bound, and the error said after it
    assert _stored_bytes(private, sid) < 2 * TEXT_MAX


@pytest.mark.parametrize(
    ("model", "counted"),
    [("badusage", {"input": 0, "output": 0}), ("floatusage", {"input": 0, "output": 7})],
)
def test_token_counts_that_are_no_counts_are_dropped_and_the_request_still_counted(
    private: PrivateFleet, server: Served, tmp_path: Path, model: str, counted: dict[str, int]
) -> None:
    before = metrics.snapshot(private.store).counters
    sid, tid, prompt = new_turn(private, tmp_path, model)

    turn = ended(private, tid)

    assert turn.state.value == "completed"
    assert said(private, sid, tid) == "Counted anyway."
    after = metrics.snapshot(private.store).counters
    ok = after["fleet_model_requests"][("ok",)] - before["fleet_model_requests"].get(("ok",), 0)
    assert ok == 1
    tokens = after.get("fleet_model_tokens", {})
    assert all(value >= 0 for value in tokens.values())
    for direction, count in counted.items():
        earlier = before.get("fleet_model_tokens", {}).get((direction,), 0)
        assert tokens.get((direction,), 0) - earlier == count
    # and the turn's own totals hold what was a count (the rest dropped, not the whole step)
    assert turn.usage == {"inputTokens": counted["input"], "outputTokens": counted["output"]}


def test_more_tool_calls_than_the_bound_fail_the_turn_before_any_runs(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "manycalls")  # 70 calls in one answer

    turn = ended(private, tid)

    assert turn.state.value == "failed"
    assert "more than 64 tool calls in one step" in turn.error
    assert len(server.records(prompt=prompt)) == 1
    assert updates_of(private, sid, tid, "tool_call") == []
