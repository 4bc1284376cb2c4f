"""``fleet prompt`` follows its turn and ``fleet sessions show`` shows one session. In
process with typer's ``CliRunner`` against the real test Redis and the shared
real workers."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from api.cli import app
from orchestrator.archiving import deletion
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn.turns import TurnState, get_turn
from tests.helpers import ctrl_c_reaches_it, wait_for

runner = CliRunner()


def _run(*args: str) -> Result:
    result = runner.invoke(app, list(args), env={"COLUMNS": "300"})
    assert "Traceback" not in result.output, result.output
    return result


def _new(store: Store) -> str:
    return sessions.create_session(store, f"/tmp/fleet-cli-turns/{uuid.uuid4().hex}").session_id


def test_prompt_prints_the_turns_output_and_exits_0_when_it_completes(
    fleet: Any, store: Store
) -> None:
    sid = _new(store)
    result = _run("prompt", sid, "say one\\nexec 0.1\\nsay two")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "one" and lines[-1] == "two", result.stdout
    assert any(line.startswith("-> sleep 0.1") for line in lines), result.stdout
    # (a log line of an earlier test's logging set-up in this process may come first)
    said = result.stderr.splitlines()
    assert any(re.fullmatch(r"turn turn_[0-9a-f]{24}", line) for line in said), result.stderr


def test_a_failed_turn_exits_1_with_its_reason(fleet: Any, store: Store) -> None:
    sid = _new(store)
    result = _run("prompt", sid, "say before\\nfrobnicate now")
    assert result.exit_code == 1, result.output
    assert "before" in result.stdout
    assert "turn failed" in result.stderr and "frobnicate" in result.stderr, result.stderr


def test_a_refused_prompt_exits_2(store: Store) -> None:
    sid = _new(store)
    assert _run("archive", sid).exit_code == 0
    result = _run("prompt", sid, "say hi")
    assert result.exit_code == 2
    assert "session_archived" in result.stderr


def test_prompt_json_prints_updates_then_the_turn(fleet: Any, store: Store) -> None:
    sid = _new(store)
    result = _run("prompt", sid, "say hi", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[-1]["state"] == "completed" and rows[-1]["sessionId"] == sid
    assert any(r.get("content", {}).get("text") == "hi" for r in rows[:-1]), rows


def test_detach_prints_the_turn_id_at_once(fleet: Any, store: Store) -> None:
    sid = _new(store)
    result = _run("prompt", sid, "think 30", "--detach")
    assert result.exit_code == 0
    tid = result.stdout.strip()
    assert re.fullmatch(r"turn_[0-9a-f]{24}", tid), result.stdout
    assert _run("archive", sid, "--stop").exit_code == 0


def test_sessions_show_shows_an_archived_session_with_its_conversation(
    fleet: Any, store: Store
) -> None:
    sid = _new(store)
    assert _run("prompt", sid, "say hello there").exit_code == 0
    assert _run("archive", sid).exit_code == 0
    out = _run("sessions", "show", sid).stdout
    assert sid in out
    assert re.search(r"archived\s+yes", out), out
    assert "> say hello there" in out and "hello there" in out, out
    body = json.loads(_run("sessions", "show", sid, "--json").stdout)
    assert body["session"]["archived"] is True
    assert [u["sessionUpdate"] for u in body["conversation"]][:2] == [
        "user_message_chunk",
        "agent_message_chunk",
    ]


def test_sessions_show_of_an_unknown_session_exits_2() -> None:
    result = _run("sessions", "show", "sess_" + "0" * 24, "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["code"] == "session_not_found"


def test_ctrl_c_stops_following_and_leaves_the_turn_running(
    fleet: Any, store: Store, tmp_path: Path
) -> None:
    sid = _new(store)
    err = tmp_path / "prompt.err"
    with open(err, "wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "prompt", sid, "think 30"],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
            preexec_fn=ctrl_c_reaches_it,
        )
    try:
        wait_for(lambda: "turn turn_" in err.read_text(), 30, message="the turn to start")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    said = err.read_text()
    assert "stopped following turn" in said and "Traceback" not in said, said
    live = json.loads(_run("activity", sid, "--json").stdout)
    assert [i["family"] for i in live] == ["turn"], "the turn goes on"
    assert _run("archive", sid, "--stop").exit_code == 0


def _prompt_in_background(sid: str, text: str, err: Path) -> subprocess.Popen[bytes]:
    """``fleet prompt sid text`` in a process of its own, its stderr in ``err``; returns once
    it printed its turn id."""
    with open(err, "wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "prompt", sid, text],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
        )
    wait_for(lambda: "turn turn_" in err.read_text(), 60, message=f"the turn of {text!r}")
    return proc


def test_a_turn_stopped_by_an_archive_says_the_session_was_archived(
    fleet: Any, store: Store, tmp_path: Path
) -> None:
    # Given a session with a turn mid-step (its step in flight) and a turn queued behind it,
    # each followed by fleet prompt
    sid = _new(store)
    procs = []
    try:
        procs.append(_prompt_in_background(sid, "think 30", tmp_path / "running.err"))
        running = re.findall(r"turn_[0-9a-f]{24}", (tmp_path / "running.err").read_text())[0]
        wait_for(
            lambda: store.redis.exists(store.keys.step_lease(running)),
            30,
            message="the first turn's step to be in flight",
        )
        procs.append(_prompt_in_background(sid, "say never", tmp_path / "queued.err"))
        queued = re.findall(r"turn_[0-9a-f]{24}", (tmp_path / "queued.err").read_text())[0]
        assert get_turn(store, queued).state is TurnState.QUEUED  # type: ignore[union-attr]

        # When the session is archived with its work stopped
        assert _run("archive", sid, "--stop").exit_code == 0

        # Then both prompts end 1 saying the session was archived: the queued turn ended in
        # the archive's script, the one mid-step by its worker after it (cancelling first)
        assert [p.wait(60) for p in procs] == [1, 1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for name, tid in (("running", running), ("queued", queued)):
        said = (tmp_path / f"{name}.err").read_text()
        assert "turn cancelled: session archived" in said, (name, said)
        turn = get_turn(store, tid)
        assert turn is not None and turn.state is TurnState.CANCELLED
        # ACP's stop reason stays its own; the turn says why
        assert (turn.stop_reason, turn.cancelled_by) == ("cancelled", "archive")
        assert turn.to_wire()["cancelledBy"] == "archive"


def test_a_turn_stopped_by_a_delete_says_the_session_was_deleted(
    fleet: Any, store: Store, dispatcher: Any, tmp_path: Path
) -> None:
    # Given a subagent session with a turn mid-step, followed by fleet prompt
    parent = _new(store)
    sid = sessions.create_session(store, "/tmp/fleet-cli-turns", parent).session_id
    err = tmp_path / "running.err"
    proc = _prompt_in_background(sid, "think 30", err)
    try:
        tid = re.findall(r"turn_[0-9a-f]{24}", err.read_text())[0]
        wait_for(lambda: store.redis.exists(store.keys.step_lease(tid)), 30, message="the step")
        # When its parent is deleted with its work stopped (archived first, then deleted once
        # the turn has ended)
        result = deletion.delete(store, dispatcher, parent, stop_activity=True)
        assert result.deleted and result.deleted_descendants == [sid]
        # Then the prompt ends 1 saying the session was deleted, not archived
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    said = err.read_text()
    assert "turn cancelled: session deleted" in said, said
    turn = get_turn(store, tid)
    assert turn is not None and turn.cancelled_by == "delete"  # the record says so itself


# -- --idempotency-key (the retry of a lost reply: tests/faults/test_lost_write_reply.py) ---
def test_sessions_new_with_a_key_given_twice_creates_one_session(store: Store) -> None:
    cwd, key = f"/tmp/fleet-cli-idem/{uuid.uuid4().hex}", str(uuid.uuid4())
    first = _run("sessions", "new", cwd, "--idempotency-key", key)
    again = _run("sessions", "new", cwd, "--idempotency-key", key)
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert first.stdout == again.stdout
    [made] = sessions.list_sessions(store, cwd=cwd).sessions
    assert first.stdout.strip() == made.session_id


def test_prompt_with_a_key_given_twice_starts_one_turn(store: Store) -> None:
    sid = sessions.create_session(store, f"/tmp/fleet-cli-idem/{uuid.uuid4().hex}").session_id
    key = str(uuid.uuid4())
    first = _run("prompt", sid, "say hi", "--detach", "--idempotency-key", key)
    again = _run("prompt", sid, "say hi", "--detach", "--idempotency-key", key)
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert first.stdout == again.stdout
    other = _run("prompt", sid, "say ho", "--detach", "--idempotency-key", key, "--json")
    assert other.exit_code == 2
    assert json.loads(other.stdout)["error"]["code"] == "idempotency_key_reused"


def test_a_malformed_key_is_refused_before_anything_is_written(store: Store) -> None:
    cwd = f"/tmp/fleet-cli-idem/{uuid.uuid4().hex}"
    result = _run("sessions", "new", cwd, "--idempotency-key", "has space", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["code"] == "invalid_idempotency_key"
    assert sessions.list_sessions(store, cwd=cwd).sessions == []
