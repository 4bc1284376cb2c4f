"""The ``fleet`` command line (``api/cli/``) in process with typer's ``CliRunner``, against the
real test Redis (conftest sets ``FLEET_REDIS_URL`` and ``FLEET_KEY_PREFIX``). ``api/context.py``
caches the store and dispatcher per process, which is fine: the environment is fixed for the run.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from api.cli import app
from tests.helpers import rest_client, wait_for

ID_RE = re.compile(r"^sess_[0-9a-f]{24}$")
TURN_RE = re.compile(r"^turn_[0-9a-f]{24}$")

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich reads the width from ``COLUMNS`` (or the real terminal) at every print; pin it so
    tables and messages are not cut or wrapped differently from one machine to another."""
    monkeypatch.setenv("COLUMNS", "300")


def _run(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    output = result.output
    assert "Traceback" not in output, output
    if result.exit_code not in (0, 2):
        raise AssertionError(f"fleet {' '.join(args)} exited {result.exit_code}: {output}") from (
            result.exception
        )
    return result


def _ok(*args: str) -> str:
    result = _run(*args)
    assert result.exit_code == 0, f"fleet {' '.join(args)}: {result.output}"
    return result.stdout


def _flat(text: str) -> str:
    """Whitespace-normalized text (rich wraps long lines at the console width)."""
    return " ".join(text.split())


def _cwd() -> str:
    return f"/tmp/fleet-cli-test/{uuid.uuid4().hex}"


def _new(cwd: str | None = None) -> str:
    out = _ok("sessions", "new", cwd or _cwd()).strip()
    assert ID_RE.match(out), out
    return out


def _ls(*flags: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads(_ok("sessions", "ls", "--json", *flags))
    return listed


def _activity(sid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(_ok("activity", sid, "--json"))
    return items


def test_sessions_new_prints_an_id_listed_by_ls() -> None:
    cwd = _cwd()
    sid = _new(cwd)
    listed = {s["sessionId"]: s for s in _ls()}
    assert sid in listed
    assert listed[sid]["cwd"] == cwd
    assert listed[sid]["archived"] is False
    assert [s["sessionId"] for s in _ls("--cwd", cwd)] == [sid]


def test_sessions_new_json_prints_the_session_as_ls_lists_it() -> None:
    cwd = _cwd()
    created = json.loads(_ok("sessions", "new", cwd, "--json"))
    assert ID_RE.match(created["sessionId"]), created
    listed = next(s for s in _ls() if s["sessionId"] == created["sessionId"])
    assert created == listed


def test_sessions_new_with_parent() -> None:
    parent = _new()
    child = _ok("sessions", "new", _cwd(), "--parent", parent).strip()
    assert ID_RE.match(child), child
    info = next(s for s in _ls() if s["sessionId"] == child)
    assert info["_meta"]["agentFleet"]["parentId"] == parent


def test_sessions_ls_table() -> None:
    cwd = _cwd()
    sid = _new(cwd)
    out = _ok("sessions", "ls", "--cwd", cwd)
    assert "sessionId" in out
    assert sid in out
    assert cwd in out


def test_sessions_ls_table_shows_whole_ids_at_80_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cwd = _cwd()
    sid = _new(cwd)
    monkeypatch.setenv("COLUMNS", "80")
    out = _ok("sessions", "ls", "--cwd", cwd)
    assert sid in out


def test_archive_and_unarchive_quiet_session() -> None:
    cwd = _cwd()
    sid = _new(cwd)

    out = _ok("archive", sid)
    assert _flat(out) == f"{sid}: archived"
    assert sid not in {s["sessionId"] for s in _ls()}
    archived = {s["sessionId"]: s for s in _ls("--archived")}
    assert archived[sid]["archived"] is True
    assert all(s["archived"] for s in archived.values())
    assert [s["sessionId"] for s in _ls("--all", "--cwd", cwd)] == [sid]

    assert _flat(_ok("archive", sid)) == f"{sid}: already archived"

    assert _flat(_ok("unarchive", sid)) == f"{sid}: unarchived"
    assert sid in {s["sessionId"] for s in _ls()}
    assert sid not in {s["sessionId"] for s in _ls("--archived")}
    assert _flat(_ok("unarchive", sid)) == f"{sid}: was not archived"


def test_audit_pages_on_with_before_and_a_full_page_names_the_next_command() -> None:
    # Given a session with five audit entries
    sid = _new()
    for _ in range(2):
        _ok("archive", sid)
        _ok("unarchive", sid)
    _ok("archive", sid)
    whole = json.loads(_ok("audit", sid, "--json"))
    assert len(whole) == 5
    # When its trail is read two entries at a time
    first = _run("audit", sid, "--limit", "2")
    hint = f"older entries: fleet audit {sid} --limit 2 --before {whole[1]['id']}"
    # Then a full page ends with the command for the entries before it, on stderr
    assert first.stderr.strip() == hint, first.stderr
    pages, before = [], None
    while True:
        args = ["audit", sid, "--limit", "2", "--json"] + (["--before", before] if before else [])
        page = json.loads(_ok(*args))
        pages += page
        if len(page) < 2:
            break
        before = page[-1]["id"]
    # And paging on with --before reads each entry once, newest first
    assert [e["id"] for e in pages] == [e["id"] for e in whole]
    # And an id that is not an entry's is refused with the reason
    bad = _run("audit", sid, "--before", "yesterday")
    assert bad.exit_code == 2 and "before must be the id of an audit entry" in bad.stderr


def test_archive_json_of_a_quiet_session() -> None:
    sid = _new()
    body = json.loads(_ok("archive", sid, "--json"))
    assert body["sessionId"] == sid
    assert body["outcome"] == "archived"
    assert body["stopped"] == []


def test_unarchive_json_answers_what_the_http_api_answers() -> None:
    sid = _new()
    _ok("archive", sid)
    assert json.loads(_ok("unarchive", sid, "--json")) == {
        "sessionId": sid,
        "archived": False,
        "restored": 1,
    }
    again = json.loads(_ok("unarchive", sid, "--json"))
    with rest_client() as client:
        assert again == client.post(f"/sessions/{sid}/unarchive").json()
    assert again["restored"] == 0
    missing = _run("unarchive", "sess_doesnotexist", "--json")
    assert missing.exit_code == 2, missing.output
    assert json.loads(missing.stdout)["error"]["code"] == "session_not_found"


@pytest.mark.parametrize("command", ["archive", "unarchive", "activity"])
@pytest.mark.parametrize("sid", ["sess_doesnotexist", "a*b", "../.."])
def test_unknown_session_exits_2_with_a_readable_error(command: str, sid: str) -> None:
    result = _run(command, sid)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "session_not_found" in result.stderr
    assert "was not found" in _flat(result.stderr)
    assert result.stdout == ""


def test_prompt_unknown_session_exits_2() -> None:
    result = _run("prompt", "sess_doesnotexist", "say hi")
    assert result.exit_code == 2
    assert "session_not_found" in result.stderr


def test_prompt_archived_session_exits_2() -> None:
    sid = _new()
    _ok("archive", sid)
    result = _run("prompt", sid, "say hi")
    assert result.exit_code == 2
    assert "session_archived" in result.stderr
    assert _activity(sid) == []


@pytest.mark.parametrize("cwd", ["relative/path", "./x", ""])
def test_sessions_new_relative_path_exits_2(cwd: str) -> None:
    result = _run("sessions", "new", cwd)
    assert result.exit_code == 2, result.output
    assert "invalid_params" in result.stderr
    assert "cwd must be an absolute path" in _flat(result.stderr)
    assert result.stdout == ""


def test_sessions_ls_relative_cwd_exits_2() -> None:
    result = _run("sessions", "ls", "--cwd", "relative")
    assert result.exit_code == 2
    assert "cwd must be an absolute path" in _flat(result.stderr)


def test_sessions_new_non_utf8_path_exits_2() -> None:
    result = runner.invoke(app, ["sessions", "new", "/tmp/\udcff"])
    assert result.exit_code == 2, repr(result.exception)
    assert "invalid_params" in result.stderr


def test_activity_of_a_quiet_session() -> None:
    sid = _new()
    assert _activity(sid) == []
    assert "no live activity" in _ok("activity", sid)


def test_archive_live_turn_refused_then_stopped(fleet: Any) -> None:
    sid = _new()
    tid = _ok("prompt", sid, "think 30", "--detach").strip()
    assert TURN_RE.match(tid), tid
    wait_for(
        lambda: any(i["family"] == "turn" and i["id"] == tid for i in _activity(sid)),
        message="the activity to list the turn",
    )
    try:
        refused = _run("archive", sid)
        assert refused.exit_code == 2, refused.output
        err = _flat(refused.stderr)
        assert "session_active" in err
        assert f"- turn {tid}" in err
        assert "think 30" in err
        assert refused.stdout == ""
        assert sid not in {s["sessionId"] for s in _ls("--archived")}
        # The refusal stopped nothing.
        assert [i["id"] for i in _activity(sid)] == [tid]
        assert tid in _ok("activity", sid)
    finally:
        stopped = _run("archive", sid, "--stop", "--json")

    assert stopped.exit_code == 0, stopped.output
    body = json.loads(stopped.stdout)
    assert body["outcome"] == "archived"
    assert tid in [i["id"] for i in body["stopped"]]
    assert body["stopDispatch"]["sent"].get("turn") == 1
    assert sid in {s["sessionId"] for s in _ls("--archived")}
    wait_for(lambda: _activity(sid) == [], message="the activity to drain")

    # Unarchive restores nothing.
    assert _flat(_ok("unarchive", sid)) == f"{sid}: unarchived"
    assert _activity(sid) == []


def test_prompt_runs_a_turn(fleet: Any, store: Any) -> None:
    from orchestrator.turn.turns import get_turn

    sid = _new()
    tid = _ok("prompt", sid, "say one\\nsay two", "--detach").strip()
    assert TURN_RE.match(tid), tid
    wait_for(lambda: _activity(sid) == [], message="the turn to finish")
    turn = get_turn(store, tid)
    assert turn is not None
    assert turn.state.value == "completed"
    assert turn.prompt == "say one\nsay two", "'\\n' separates scripted instructions"
    assert _flat(_ok("archive", sid)) == f"{sid}: archived"


def test_sweep_runs_one_pass_of_the_turn_sweeper_and_prints_what_it_did() -> None:
    # A day without progress: no turn of this run is that old, so the pass only reports
    report = json.loads(_ok("sweep", "--json", "--stuck-seconds", "86400"))
    assert report["examined"] == 0
    assert report["totals"] == {"resumed": 0, "failed": 0, "settled": 0, "removed": 0}
    assert report["waiting"] == 0
    said = _flat(_ok("sweep", "--stuck-seconds", "86400"))
    assert "sweep: 0 examined" in said and "waiting 0" in said


# --------------------------------------------------------------------------- delete


def test_delete_of_a_quiet_session_and_its_subagent_then_nothing_to_delete() -> None:
    sid = _new()
    child = _ok("sessions", "new", _cwd(), "--parent", sid).strip()
    assert _flat(_ok("delete", sid)) == f"{sid}: deleted with 1 subagent session(s)"
    assert sid not in {s["sessionId"] for s in _ls("--all")}
    assert _run("sessions", "show", child).exit_code == 2
    # Idempotent, as the HTTP API: a deleted or unknown session has nothing to delete
    assert _flat(_ok("delete", sid)) == f"{sid}: nothing to delete"
    assert _flat(_ok("delete", "sess_doesnotexist")) == "sess_doesnotexist: nothing to delete"
    assert _flat(_ok("delete", "a*b", "--stop")) == "a*b: nothing to delete"


def test_delete_json_answers_what_the_http_api_answers() -> None:
    sid = _new()
    child = _ok("sessions", "new", _cwd(), "--parent", sid).strip()
    body = json.loads(_ok("delete", sid, "--json"))
    assert body == {"sessionId": sid, "deleted": True, "deletedDescendants": [child]}
    again = json.loads(_ok("delete", sid, "--json", "--stop"))
    with rest_client() as client:
        resp = client.request("DELETE", f"/sessions/{sid}", json={"stopActivity": True})
        assert again == resp.json()
    assert again == {
        "sessionId": sid,
        "deleted": False,
        "deletedDescendants": [],
        "stopped": [],
        "stopDispatch": {"sent": {}, "failed": []},
    }


def test_delete_confirmed_without_stop_exits_2() -> None:
    sid = _new()
    result = _run("delete", sid, "--confirmed", "turn:turn_1")
    assert result.exit_code == 2
    assert "invalid_params" in result.stderr and "--confirmed needs --stop" in result.stderr
    assert sid in {s["sessionId"] for s in _ls()}


def test_delete_of_a_busy_session_is_refused_with_its_items_then_stopped(fleet: Any) -> None:
    # Given a session whose subagent runs a turn
    parent = _new()
    sid = _ok("sessions", "new", _cwd(), "--parent", parent).strip()
    tid = _ok("prompt", sid, "think 30", "--detach").strip()
    wait_for(lambda: any(i["id"] == tid for i in _activity(sid)), message="the turn")
    try:
        # When the parent is deleted without --stop: refused, exit 2, the live items listed
        refused = _run("delete", parent)
        assert refused.exit_code == 2, refused.output
        err = _flat(refused.stderr)
        assert "session_active" in err and "delete with --stop" in err
        assert f"- subagent {sid}" in err
        assert refused.stdout == ""
        as_json = _run("delete", parent, "--json")
        assert as_json.exit_code == 2
        error = json.loads(as_json.stdout)["error"]
        assert error["code"] == "session_active"
        assert [(i["family"], i["id"]) for i in error["data"]["activity"]] == [("subagent", sid)]
        # and nothing was deleted or stopped
        assert [i["id"] for i in _activity(sid)] == [tid]
    finally:
        stopped = _run("delete", parent, "--stop", "--json")
    # Then --stop stops the work as archive --stop does and deletes the tree once it ended
    assert stopped.exit_code == 0, stopped.output
    body = json.loads(stopped.stdout)
    assert (body["deleted"], body["deletedDescendants"]) == (True, [sid])
    assert [(i["family"], i["id"]) for i in body["stopped"]] == [("subagent", sid)]
    assert _run("sessions", "show", parent).exit_code == 2


def test_delete_stop_on_a_terminal_lists_the_work_and_a_no_keeps_the_session(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from orchestrator.reminder import reminders

    sid = _new()
    rid = reminders.create_reminder(store, sid, 600, "later")
    # (a terminal: the command reads sys.stdin.isatty(), which CliRunner's input is not)
    terminal = SimpleNamespace(stdin=SimpleNamespace(isatty=lambda: True))
    monkeypatch.setattr("api.cli.archive.sys", terminal)
    result = runner.invoke(app, ["delete", sid, "--stop"], input="n\n")
    assert result.exit_code == 1, result.output
    said = _flat(result.output)
    assert f"{sid} has live work:" in said and f"reminder {rid}" in said
    assert "Stop these 1 item(s) and delete?" in said
    assert [i["id"] for i in _activity(sid)] == [rid]
    assert sid in {s["sessionId"] for s in _ls()}
