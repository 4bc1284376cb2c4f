"""Stopping turns on real turn workers: an in-flight tool call and its child process, queued
turns, and stops that name turns exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.turn.turns import cancel_session_turns, start_turn
from tests.helpers import RecordingDispatcher, wait_for
from tests.workers.support import (
    history,
    requests_of,
    sleep_processes,
    stop_takers,
    turn_state,
    wait_log_of_any,
    wait_request,
    wait_turn_state,
    worker,
)

pytestmark = pytest.mark.timeout(60)


def test_an_archive_stops_a_turn_in_exec_kills_its_child_and_discards_the_queued_turns(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn running a 31.7 s child process, and two prompts queued behind it
    sid = sessions.new()
    turn_pid = worker(fleet, "turn").process.pid
    tid = start_turn(store, dispatcher, sid, "exec 31.7")
    queued = [start_turn(store, dispatcher, sid, f"say queued {n}") for n in (1, 2)]
    assert [turn_state(store, q) for q in queued] == ["queued", "queued"]
    wait_for(lambda: sleep_processes(turn_pid, "31.7"), 15, message="the exec child process")

    # When the session is archived with stop_activity
    result = archive(store, dispatcher, sid, stop_activity=True)

    # Then the running turn ends cancelled and its child process is gone
    assert result.stop_report.sent == {"turn": 3}
    wait_turn_state(store, tid, "cancelled")
    wait_for(lambda: not sleep_processes(turn_pid, "31.7"), 15, message="the child to end")

    # And the tool call was settled as cancelled by the archive itself (the conversation does
    # not end on a call in progress), and nothing the step did landed after it
    updates = [u for u in history(store, sid) if u.get("turnId") == tid]
    kinds = [u["sessionUpdate"] for u in updates]
    assert kinds == ["user_message_chunk", "tool_call", "tool_call_update"]
    assert updates[2]["toolCallId"] == updates[1]["toolCallId"]
    assert updates[2]["status"] == "cancelled"
    assert updates[2]["content"][0]["content"]["text"] == "stopped by the archive"

    # And the queued turns are discarded: cancelled, never run
    for q in queued:
        wait_turn_state(store, q, "cancelled")
        assert requests_of(store, sid, q) == []
    assert requests_of(store, sid, tid) == [0]
    assert not [u for u in history(store, sid) if u["sessionUpdate"] == "agent_message_chunk"]
    # And the discarded prompts never read as said
    assert not [u for u in history(store, sid) if u.get("turnId") in queued]


def test_a_user_cancel_settles_the_tool_call_and_a_discarded_prompt_is_never_said(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn running a 32.9 s child process, and a prompt queued behind it
    sid = sessions.new()
    turn_pid = worker(fleet, "turn").process.pid
    tid = start_turn(store, dispatcher, sid, "exec 32.9")
    queued = start_turn(store, dispatcher, sid, "say never said")
    wait_for(lambda: sleep_processes(turn_pid, "32.9"), 15, message="the exec child process")

    # When the user cancels the session's turns
    assert cancel_session_turns(store, dispatcher, sid) == {tid: "cancelling", queued: "cancelled"}

    # Then the running turn ends cancelled and its child process is gone
    wait_turn_state(store, tid, "cancelled")
    wait_for(lambda: not sleep_processes(turn_pid, "32.9"), 15, message="the child to end")

    # And the tool call settles as a cancelled tool result (it does not vanish)
    updates = [u for u in history(store, sid) if u.get("turnId") == tid]
    [call] = [u for u in updates if u["sessionUpdate"] == "tool_call"]
    [settled] = [u for u in updates if u["sessionUpdate"] == "tool_call_update"]
    assert settled["toolCallId"] == call["toolCallId"]
    assert settled["status"] == "cancelled"

    # And the discarded prompt never appears in the conversation
    assert [u for u in history(store, sid) if u.get("turnId") == queued] == []
    assert requests_of(store, sid, queued) == []


def test_a_late_stop_naming_a_finished_turn_leaves_the_next_running_turn_alone(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a finished turn and, after it, a turn in the middle of a model request
    sid = sessions.new()
    old = start_turn(store, dispatcher, sid, "say one")
    wait_turn_state(store, old, "completed")
    new = start_turn(store, dispatcher, sid, "think 1.5\nsay two")
    wait_request(store, sid, new, 0)

    # When a stop naming the finished turn arrives late
    dispatcher.send("turn.stop", [sid, [old]], "turn.ctl")

    # Then the worker reports the old turn already ended and the new turn keeps running
    wait_log_of_any(stop_takers(fleet, "turn"), f"turn {old} not cancelled: already completed")
    assert turn_state(store, new) == "running"
    assert turn_state(store, old) == "completed"

    # And it runs to the end, both steps
    wait_turn_state(store, new, "completed")
    assert requests_of(store, sid, new) == [0, 1]
    said = [
        u["content"]["text"]
        for u in history(store, sid)
        if u["sessionUpdate"] == "agent_message_chunk" and u["turnId"] == new
    ]
    assert said[-1] == "two"


def test_a_stop_naming_only_the_running_turn_lets_the_queued_turn_run_next(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn in a long model request and a prompt queued behind it
    sid = sessions.new()
    running = start_turn(store, dispatcher, sid, "think 30")
    queued = start_turn(store, dispatcher, sid, "say next")
    wait_request(store, sid, running, 0)

    # When a stop names only the running turn
    dispatcher.send("turn.stop", [sid, [running]], "turn.ctl")

    # Then it ends cancelled and the queued turn runs to completion
    wait_turn_state(store, running, "cancelled")
    wait_turn_state(store, queued, "completed")
    assert requests_of(store, sid, queued) == [0]


def turn_events(store: Any, tid: str, after: str) -> list[dict[str, Any]]:
    """The ``turn`` events of ``tid`` in the fleet's event stream after entry ``after``."""
    entries = store.redis.xrange(store.keys.event_stream, min=f"({after}")
    found = [json.loads(fields["event"]) for _, fields in entries]
    return [e for e in found if e.get("type") == "turn" and e.get("turnId") == tid]


def test_a_turn_ended_by_an_archive_is_announced_once_when_its_stop_comes_after(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a turn in the middle of a model request
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, "think 30")
    wait_request(store, sid, tid, 0)
    [(mark, _)] = store.redis.xrevrange(store.keys.event_stream, count=1)
    # And its session archived with stop, whose script ends the turn (announcing it), the
    # stop messages held back
    held = RecordingDispatcher()
    archive(store, held, sid, stop_activity=True)
    wait_turn_state(store, tid, "cancelled")

    # When the turn.stop arrives after the turn has ended
    [stop] = [m for m in held.sent if m[0] == "turn.stop"]
    dispatcher.send(*stop)
    # (the stop task's result names the turn's state: it had ended cancelled)
    wait_log_of_any(stop_takers(fleet, "turn"), f"'turns': {{'{tid}': 'cancelled'}}")

    # Then the turn's end was announced once: the late stop found it ended and said nothing
    assert [e["state"] for e in turn_events(store, tid, mark)] == ["cancelled"]
