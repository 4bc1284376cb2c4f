"""The ``openai`` model on real turn, job and reminder workers, driving a real
OpenAI-compatible server of the tests' own (``tests/openai_server.py``, replaying
``tests/fixtures/openai``) through the official SDK. Each session names its fixture as its
model; the server's request log, not the fleet's, is what proves what was asked and when.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.session.sessions import get_session
from orchestrator.storage import metrics
from tests.faults.fleets import PrivateFleet
from tests.helpers import wait_for
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
from tests.workers.support import history, job_record, process_alive, wait_gone, wait_job_pid

pytestmark = [pytest.mark.redis, pytest.mark.integration, pytest.mark.timeout(120)]

MAX_STEPS = 3
RETRIES = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(FIXTURES, tmp_path_factory.mktemp("openai") / "requests.jsonl") as served:
        yield served


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: Any, server: Served
) -> Iterator[PrivateFleet]:
    with openai_fleet(
        redis_url, key_prefix, tmp_path_factory, "oai", server, MAX_STEPS, RETRIES
    ) as fleet:
        yield fleet


def test_a_plain_answer_streams_as_chunks_and_its_usage_is_stored_and_counted(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "plain")

    turn = ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "end_turn")
    assert turn.usage == {"inputTokens": 12, "outputTokens": 9}
    chunks = updates_of(private, sid, tid, "agent_message_chunk")
    assert len(chunks) > 1  # streamed in pieces, each its own update
    assert said(private, sid, tid) == "Hello from the fixture server, in several pieces."
    [request] = server.records(prompt=prompt)
    assert request["messages"] == [{"role": "user", "content": prompt}]
    assert request["tools"] == ["shell", "start_job", "spawn_subagent", "set_reminder"]
    info = get_session(private.store, sid).to_info()["_meta"]["agentFleet"]
    assert (info["model"], info["usage"]) == ("plain", {"inputTokens": 12, "outputTokens": 9})
    counters = metrics.snapshot(private.store).counters
    assert counters["fleet_model_tokens"][("input",)] >= 12
    assert counters["fleet_model_requests"][("ok",)] >= 1


def test_shell_runs_a_real_command_in_the_session_cwd_and_its_output_goes_back(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "shell")

    turn = ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "end_turn")
    [call] = updates_of(private, sid, tid, "tool_call")
    assert call["_meta"]["agentFleet"]["tool"] == "shell"
    [update] = updates_of(private, sid, tid, "tool_call_update")
    assert update["status"] == "completed"
    assert result_text(update).splitlines()[1:] == ["fleet-42", str(tmp_path)]
    first, second = server.records(prompt=prompt)
    assert second["messages"][-1]["role"] == "tool"
    assert "fleet-42" in second["messages"][-1]["content"]
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "shell"
    assert said(private, sid, tid) == "The command printed fleet-42."


def test_start_job_runs_a_real_background_process_on_a_job_worker(
    private: PrivateFleet, tmp_path: Path
) -> None:
    sid, tid, _ = new_turn(private, tmp_path, "job")

    assert ended(private, tid).state.value == "completed"
    [update] = updates_of(private, sid, tid, "tool_call_update")
    jid = re.fullmatch(r"started job (\S+)", result_text(update))
    assert jid is not None
    pid = wait_job_pid(private.store, jid[1])
    assert process_alive(pid)
    assert job_record(private.store, jid[1])["command"] == "sleep 41.3"

    archive(private.store, private.dispatcher, sid, stop_activity=True)
    wait_gone(pid)


def test_spawn_subagent_starts_a_real_child_session_on_the_same_model(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, _ = new_turn(private, tmp_path, "spawn")

    assert ended(private, tid).state.value == "completed"
    [update] = updates_of(private, sid, tid, "tool_call_update")
    child = re.fullmatch(r"started subagent (\S+)", result_text(update))
    assert child is not None
    assert get_session(private.store, child[1]).model == "spawn"
    child_prompt = "child task: count to three"
    wait_for(lambda: server.records(prompt=child_prompt), 30, message="the child's request")
    child_turns = [u["turnId"] for u in history(private.store, child[1])]
    assert ended(private, child_turns[0]).state.value == "completed"
    assert said(private, child[1], child_turns[0]) == "one, two, three"


def test_set_reminder_stores_a_reminder_that_fires_a_turn_on_the_model(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "reminder")

    assert ended(private, tid).state.value == "completed"

    def fired() -> list[dict[str, Any]]:
        return [
            r
            for r in server.records(prompt=prompt)
            if r["messages"][-1] == {"role": "user", "content": "the reminder fired"}
        ]

    wait_for(fired, 30, message="a request for the reminder's turn")
    users = [u for u in history(private.store, sid) if u["sessionUpdate"] == "user_message_chunk"]
    assert [u["content"]["text"] for u in users] == [prompt, "the reminder fired"]
    assert ended(private, users[1]["turnId"]).state.value == "completed"


def test_an_archive_closes_a_held_stream_and_no_request_follows_it(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    # Given a turn whose answer streams its first words, then holds the stream open
    sid, tid, prompt = new_turn(private, tmp_path, "hold")
    wait_for(lambda: said(private, sid, tid), 30, message="the streamed first words")
    assert said(private, sid, tid) == "thinking about it..."

    # When the session is archived (stopping its work)
    archive(private.store, private.dispatcher, sid, stop_activity=True)
    mark = f"archived-{sid}"
    server.mark(mark)

    # Then the turn ends cancelled, the server saw the connection close, and no request came
    # after the archive (the server's own log)
    assert ended(private, tid).state.value == "cancelled"
    wait_for(lambda: server.records("closed", prompt), 10, message="the server to see the close")
    assert len(server.records(prompt=prompt)) == 1
    assert [
        r for r in server.since_mark(mark) if r.get("prompt") == prompt and r["event"] == "request"
    ] == []


def test_a_429_is_retried_and_the_turn_answers(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "ratelimit")

    assert ended(private, tid).state.value == "completed"
    assert len(server.records(prompt=prompt)) == 2
    assert said(private, sid, tid) == "Answered after the rate limit."


def test_a_500_forever_fails_the_turn_after_bounded_retries(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "down")

    turn = ended(private, tid)

    assert turn.state.value == "failed"
    assert "500" in turn.error and "The server had an error." in turn.error
    assert len(server.records(prompt=prompt)) == RETRIES + 1


def test_another_4xx_fails_the_turn_with_the_providers_message_at_once(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "badrequest")

    turn = ended(private, tid)

    assert turn.state.value == "failed"
    assert "This model does not support tools." in turn.error
    assert len(server.records(prompt=prompt)) == 1
    assert "This model does not support tools." in said(private, sid, tid)


def test_malformed_tool_arguments_are_tool_errors_the_model_sees(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "malformed")

    assert ended(private, tid).state.value == "completed"
    updates = updates_of(private, sid, tid, "tool_call_update")
    assert [u["status"] for u in updates] == ["failed", "failed"]
    requests = server.records(prompt=prompt)
    assert len(requests) == 3
    not_json, wrong_field = (r["messages"][-1] for r in requests[1:])
    assert not_json["role"] == wrong_field["role"] == "tool"
    assert "not valid JSON" in not_json["content"]
    assert "command" in wrong_field["content"] and "cmd" in wrong_field["content"]


def test_the_step_limit_ends_a_turn_with_max_turn_requests(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = new_turn(private, tmp_path, "loop")

    turn = ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "max_turn_requests")
    assert len(server.records(prompt=prompt)) == MAX_STEPS
    assert len(updates_of(private, sid, tid, "tool_call_update")) == MAX_STEPS


def test_an_archive_during_a_retry_back_off_sends_no_further_request(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    # Given a turn whose first request met a 429 (its retry waits its back-off)
    sid, tid, prompt = new_turn(private, tmp_path, "ratelimit")
    wait_for(lambda: server.records(prompt=prompt), 30, message="the first request")

    # When the session is archived (stopping its work)
    archive(private.store, private.dispatcher, sid, stop_activity=True)
    mark = f"archived-{sid}"
    server.mark(mark)

    # Then the turn ends and no request of it reached the server after the archive
    ended(private, tid)
    after = [r for r in server.since_mark(mark) if r.get("prompt") == prompt]
    assert [r for r in after if r["event"] == "request"] == []


def test_an_archive_aborts_requests_waiting_for_headers_or_mid_stream_and_frees_their_threads(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    # Given as many turns as the turn worker has threads (4): two whose server stalls before
    # it sends any header, two whose stream stalls after its first words
    models = ("stall", "stall", "hold", "hold")
    started = [new_turn(private, tmp_path, model) for model in models]
    for (sid, tid, prompt), model in zip(started, models, strict=True):
        wait_for(lambda p=prompt: server.records(prompt=p), 30, message=f"{model}'s request")
        if model == "hold":
            wait_for(lambda s=sid, t=tid: said(private, s, t), 30, message="the first words")

    # When each session is archived with its work stopped
    for sid, _, _ in started:
        archive(private.store, private.dispatcher, sid, stop_activity=True)
    archived = time.time()

    # Then the server sees every connection closed within 2 s (not at the end of its stall),
    # each turn ends cancelled after its one request
    def closed() -> list[float]:
        found = [server.records("closed", prompt) for _, _, prompt in started]
        return [r[0]["at"] for r in found] if all(found) else []

    closes = wait_for(closed, 2.0, interval=0.01, message="the server to see 4 closes")
    assert max(closes) - archived < 2.0
    for _, tid, prompt in started:
        assert ended(private, tid).state.value == "cancelled"
        assert len(server.records(prompt=prompt)) == 1
    # and an unrelated session's turn runs meanwhile: no thread of the worker is held
    _, tid, _ = new_turn(private, tmp_path, "plain")
    assert ended(private, tid, timeout=15).state.value == "completed"
