"""What the ``fleet`` command line prints: tables that
fit the terminal, times people read, errors as JSON under ``--json``, the CLI's own words,
help without type noise, and the bulk quirks. In process with typer's ``CliRunner`` against
the real test Redis, and as a real ``fleet`` process where a pipe matters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from api.cli import app
from orchestrator.session import scripts as session_scripts
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from tests.helpers import wait_for

runner = CliRunner()
LONG_TITLE = "A rather long title that says what this session was about, at length " * 2


def _run(*args: str, columns: int = 300) -> Result:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert "Traceback" not in result.output, result.output
    return result


def _cwd() -> str:
    return f"/tmp/fleet-cli-output/{uuid.uuid4().hex}"


def _session(store: Store, cwd: str, title: str = LONG_TITLE, parent: str | None = None) -> str:
    sid = sessions.create_session(store, cwd, parent).session_id
    session_scripts.set_title(store, session_id=sid, title=title, source="client")
    return sid


@pytest.mark.parametrize("columns", [80, 100])
def test_sessions_table_keeps_every_column_meaningful_at_narrow_widths(
    store: Store, columns: int
) -> None:
    # At 80 columns a parent id (as long as the session id, and never cut) leaves too little
    # for a readable title; so the session with a parent is listed at 100.
    cwd = _cwd()
    parent = _session(store, cwd, "parent") if columns >= 100 else None
    child = _session(store, cwd, parent=parent)
    assert _run("archive", parent or child).exit_code == 0
    out = _run("sessions", "ls", "--archived", "--cwd", cwd, columns=columns).stdout
    lines = out.splitlines()
    assert all(len(line) <= columns for line in lines), out
    header = next(line for line in lines if "sessionId" in line)
    for name in ("title", "cwd", "updated", "archived", "parent"):
        assert name in header, out
    row = next(line for line in lines if line.startswith(child))
    assert "A rather" in row and "…" in row, "the title is cut with an ellipsis\n" + out
    assert "yes" in row, "archived is never dropped\n" + out
    assert "ago" in row or "now" in row, "the update time reads as people read it\n" + out
    assert cwd[-4:] in row, "a directory keeps its last part\n" + out


def test_piped_output_is_never_wrapped(store: Store, tmp_path: Path) -> None:
    cwd = _cwd()
    sid = _session(store, cwd)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "sessions", "ls", "--cwd", cwd],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if sid in line]
    assert len(rows) == 1 and LONG_TITLE.strip() in rows[0], proc.stdout


def test_wide_and_json_give_the_absolute_time(store: Store) -> None:
    cwd = _cwd()
    sid = _session(store, cwd)
    wide = _run("sessions", "ls", "--cwd", cwd, "--wide").stdout
    row = next(line for line in wide.splitlines() if line.startswith(sid))
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row), wide
    listed = json.loads(_run("sessions", "ls", "--cwd", cwd, "--json").stdout)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", listed[0]["updatedAt"])


def test_audit_table_reads_times_as_people_do(store: Store) -> None:
    sid = _session(store, _cwd())
    assert _run("archive", sid).exit_code == 0
    out = _run("audit", sid).stdout
    assert "ago" in out or "now" in out, out
    assert not re.search(r"\d{4}-\d\d-\d\dT", out), out


def test_a_refused_archive_with_json_prints_the_refusal_with_its_items(
    fleet: Any, store: Store
) -> None:
    sid = _session(store, _cwd())
    tid = _run("prompt", sid, "think 30", "--detach").stdout.strip()
    wait_for(lambda: json.loads(_run("activity", sid, "--json").stdout), message="live work")
    try:
        refused = _run("archive", sid, "--json")
        assert refused.exit_code == 2
        body = json.loads(refused.stdout)
        assert body["error"]["code"] == "session_active"
        assert [i["id"] for i in body["error"]["data"]["activity"]] == [tid]
        assert "--stop" in body["error"]["message"]
        assert "stopActivity" not in body["error"]["message"]
    finally:
        assert _run("archive", sid, "--stop", "--json").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ("archive", "sess_doesnotexist", "--json"),
        ("activity", "../..", "--json"),
        ("sessions", "ls", "--cwd", "relative", "--json"),
        ("sessions", "ls", "--all", "--archived", "--json"),
        ("archive", "--bulk", "--json"),
        ("archive", "--json", "--no-such-option"),
        ("sessions", "show", "--json"),
    ],
)
def test_errors_under_json_are_json_on_stdout(args: tuple[str, ...]) -> None:
    result = _run(*args)
    assert result.exit_code == 2, result.output
    body = json.loads(result.stdout)
    assert set(body["error"]) == {"code", "message", "data"}, body
    assert body["error"]["code"] in ("session_not_found", "invalid_params"), body


def test_messages_speak_the_cli_words(store: Store) -> None:
    result = _run("archive", "--bulk", "--idle-since", "yesterday")
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert "--idle-since must be an ISO 8601 date-time" in text, text
    assert "idleSince" not in text


def test_all_and_archived_are_refused_together() -> None:
    result = _run("sessions", "ls", "--all", "--archived")
    assert result.exit_code == 2
    assert "--all and --archived exclude each other" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    "args",
    [(), ("archive",), ("sessions", "ls"), ("prompt",), ("sweep",), ("beat",), ("worker",)],
)
def test_help_reads_well(args: tuple[str, ...]) -> None:
    out = _run(*args, "--help", columns=100).stdout
    assert not re.search(r"<(bool|str|int|float|list\[str\])>", out), out
    assert "``" not in out and ":class:" not in out, out
    assert "[default: 0]" not in out, "a 0 standing for a setting is not a default\n" + out
    # A sentence is never broken where the docstring's lines ended: each help line runs on
    # to the panel's width unless a paragraph ends there.
    assert "with --stop\n" not in out.replace("│", "").replace(" \n", "\n"), out


def test_top_level_help_documents_exit_codes() -> None:
    out = " ".join(_run("--help").stdout.split())
    assert "Exit status: 0 done; 1 done in part" in out, out


def test_a_bulk_dry_run_that_finds_busy_sessions_only_reports_and_exits_0(
    fleet: Any, store: Store
) -> None:
    cwd = _cwd()
    sid = _session(store, cwd)
    _run("prompt", sid, "think 30", "--detach")
    wait_for(lambda: json.loads(_run("activity", sid, "--json").stdout), message="live work")
    try:
        dry = _run("archive", "--bulk", "--cwd", cwd, "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert "refused 1" in dry.stdout
        assert not dry.stderr.startswith("\n")
        real = _run("archive", "--bulk", "--cwd", cwd)
        assert real.exit_code == 1, "a real run that leaves sessions is done in part"
    finally:
        assert _run("archive", "--bulk", "--cwd", cwd, "--stop").exit_code == 0


def test_errors_start_on_the_first_line() -> None:
    result = _run("archive", "--bulk", "--cwd", "relative")
    assert result.exit_code == 2
    assert result.stderr.startswith("error (invalid_params)"), repr(result.stderr)


def test_the_audit_entry_of_a_bulk_stop_counts_the_items_stopped(fleet: Any, store: Store) -> None:
    cwd = _cwd()
    sid = _session(store, cwd)
    _run("prompt", sid, "run 30\nthink 30", "--detach")
    wait_for(
        lambda: len(json.loads(_run("activity", sid, "--json").stdout)) == 2,
        message="a turn and a job",
    )
    archived = _run("archive", "--bulk", sid, "--stop", "--json")
    assert archived.exit_code == 0, archived.output
    sent = sum(json.loads(archived.stdout)["stopDispatch"]["sent"].values())
    entries = json.loads(_run("audit", sid, "--json").stdout)
    counted = [e["detail"].get("stopped") for e in entries if e["action"] == "stop"]
    assert sent >= 1 and sent in counted, [(e["outcome"], e["detail"]) for e in entries]
    assert 0 not in counted, entries


#: An id some table cut: its start, then the ellipsis.
CUT_ID = re.compile(r"\b(?:sess|turn|job|rem)_[0-9a-f]*…")
UNICODE_TITLE = "Ünïcödé título — 日本語のとても長いタイトル, " * 3


def _family(store: Store) -> tuple[str, list[str]]:
    """A directory deep enough to be cut and three sessions in it, each the parent of the
    next, with a long title of wide characters."""
    cwd = _cwd() + "/a/rather/deep/directory/" + "sub/" * 8 + "end"
    root = _session(store, cwd, UNICODE_TITLE)
    child = _session(store, cwd, UNICODE_TITLE, parent=root)
    return cwd, [root, child, _session(store, cwd, "short", parent=child)]


def _ids_whole(out: str, ids: list[str]) -> None:
    assert not CUT_ID.search(out), "an id was cut\n" + out
    for sid in ids:
        assert re.search(rf"\b{sid}\b", out), f"{sid} is not whole\n{out}"


@pytest.mark.parametrize("wide", [False, True], ids=["ls", "ls-wide"])
@pytest.mark.parametrize("columns", [60, 80, 100])
def test_sessions_table_never_cuts_a_session_or_parent_id(
    store: Store, columns: int, wide: bool
) -> None:
    cwd, ids = _family(store)
    out = _run("sessions", "ls", "--cwd", cwd, *(["--wide"] if wide else []), columns=columns)
    assert out.exit_code == 0, out.output
    _ids_whole(out.stdout, ids)
    rows = {sid: line for line in out.stdout.splitlines() for sid in ids if line.startswith(sid)}
    assert ids[0] in rows[ids[1]] and ids[1] in rows[ids[2]], "the parent on its child's row"
    # Two whole ids take 62 characters with their gaps; the other columns fit beside them,
    # cut to a few characters, from 80 columns (85 with --wide); below that the lines are
    # wider than the terminal, never an id cut or wrapped.
    if columns >= (85 if wide else 80):
        assert all(len(line) <= columns for line in out.stdout.splitlines()), out.stdout


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_audit_table_never_cuts_a_session_id(store: Store, columns: int) -> None:
    _, ids = _family(store)
    for _ in range(2):  # the second: outcome already_archived, a long word
        assert _run("archive", ids[0]).exit_code == 0
    out = _run("audit", "--limit", "1000", columns=columns)  # the fleet's: a sessionId column
    assert out.exit_code == 0, out.output
    _ids_whole(out.stdout, ids[:1])
    assert re.search(rf"{ids[0]}.*\n.*{ids[0]}", out.stdout), "one row per entry\n" + out.stdout


@pytest.mark.parametrize("columns", [40, 60, 80, 100])
def test_auto_archive_dry_run_table_keeps_ids_and_the_end_of_directories(
    store: Store, columns: int
) -> None:
    cwd, ids = _family(store)
    dry = ("auto-archive", "--dry-run", "--cwd", cwd, "--idle-seconds", "0.01")
    # The root alone is listed: archiving it archives its descendants.
    wait_for(lambda: ids[0] in _run(*dry).stdout, message="the sessions idle")
    out = _run(*dry, columns=columns)
    assert out.exit_code == 0, out.output
    _ids_whole(out.stdout, ids[:1])
    if columns >= 60:  # a directory is cut at its start: its last part says the most
        assert all(cwd[-4:] in line for line in out.stdout.splitlines() if "sess_" in line)
