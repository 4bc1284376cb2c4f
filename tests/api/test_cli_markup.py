"""What people type shows as they typed it: a title, a directory, a session id or a prompt
holding Rich markup (``[/b]``, ``[bold red]x[/]``) or an emoji code (``:x:``) is printed
literally by every ``fleet`` command, never read as markup (a stray closing tag would end the
command with a traceback) nor turned into an emoji
(``root:x:0:0`` came out as ``root❌0:0``). In process with typer's ``CliRunner`` against the
real test Redis, and the shared fleet where live work is needed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from api.cli import app
from api.cli.common import console, err
from orchestrator.session import sessions, titles
from orchestrator.storage.store import Store
from tests.helpers import wait_for

runner = CliRunner()

#: A stray closing tag, a styled span and an emoji code.
RAW = "[/b] :x: [bold red]x[/]"


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")


def _run(*args: str, codes: tuple[int, ...] = (0,)) -> Result:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"fleet {' '.join(args)} raised {result.exception!r}: {result.output}"
    )
    assert result.exit_code in codes, (result.exit_code, result.output)
    return result


def _cwd() -> str:
    return f"/tmp/fleet-cli-markup/{uuid.uuid4().hex}/{RAW}"


def _marked_session(store: Store) -> tuple[str, str]:
    """A session whose directory and title both hold ``RAW``, made through the CLI."""
    cwd = _cwd()
    made = _run("sessions", "new", cwd)
    assert cwd in made.stderr, "the note names the directory as given\n" + made.stderr
    sid = made.stdout.strip()
    titles.set_title(store, sid, f"{RAW} hello")
    return sid, cwd


def test_the_consoles_print_markup_and_emoji_codes_literally() -> None:
    for out in (console, err):
        with out.capture() as captured:
            out.print(f"root:x:0:0 {RAW}")
        assert captured.get() == f"root:x:0:0 {RAW}\n"


def test_titles_and_directories_show_literally_in_listings_and_details(store: Store) -> None:
    sid, cwd = _marked_session(store)
    for flags in ([], ["--all"], ["--wide"]):
        out = _run("sessions", "ls", "--cwd", cwd, *flags).stdout
        row = next(line for line in out.splitlines() if line.startswith(sid))
        assert f"{RAW} hello" in row and cwd in row, out

    shown = _run("sessions", "show", sid).stdout
    assert f"title     {RAW} hello" in shown, shown
    assert f"cwd       {cwd}" in shown, shown

    for args in (["audit", sid], ["audit"]):
        out = _run(*args).stdout
        assert f"title={json.dumps(f'{RAW} hello')}" in out, out


def test_the_auto_archive_dry_run_table_shows_titles_literally(store: Store) -> None:
    sid, cwd = _marked_session(store)

    def listed() -> str | None:
        args = ("auto-archive", "--dry-run", "--cwd", cwd, "--idle-seconds", "0.001")
        out = _run(*args).stdout
        return out if sid in out else None

    out = wait_for(listed, message="the idle session in the dry run")
    row = next(line for line in out.splitlines() if sid in line)
    assert cwd in row and f"{RAW} hello" in row, out


def test_ids_echoed_in_errors_show_literally(tmp_path: Path) -> None:
    bad = "[/x]"
    refused = _run("sessions", "show", bad, codes=(2,))
    assert bad in refused.stderr, refused.stderr
    assert bad in _run("audit", bad, codes=(2,)).stderr
    assert bad in _run("activity", bad, codes=(2,)).stderr
    assert bad in _run("unarchive", bad, codes=(2,)).stderr

    missing = f"sess_{uuid.uuid4().hex[:24]}"
    result = _run("bulk-archive", bad, missing, codes=(1, 2))
    assert bad in result.output, result.output

    ids = tmp_path / "ids"
    ids.write_text(f"root:x:0:0\n{RAW}\n")
    dry = _run("bulk-archive", "--ids-file", str(ids), "--dry-run").stdout
    assert f"not found: root:x:0:0, {RAW}" in dry, dry


def test_live_work_labels_show_literally(fleet: Any, store: Store) -> None:
    sid = sessions.create_session(store, _cwd()).session_id
    prompt = f"say {RAW}\nthink 30"
    tid = _run("prompt", sid, prompt, "--detach").stdout.strip()
    label = f'turn "say {RAW}"'

    def activity() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(_run("activity", sid, "--json").stdout)
        return items

    wait_for(lambda: any(i["id"] == tid for i in activity()), message="the live turn")
    try:
        assert label in _run("activity", sid).stdout
        assert label in _run("sessions", "show", sid).stdout
        refused = _run("archive", sid, codes=(2,))
        assert "session_active" in refused.stderr and label in refused.stderr, refused.stderr
        bulk = _run("bulk-archive", sid, codes=(1,))
        assert label in bulk.stdout, bulk.stdout
    finally:
        _run("archive", sid, "--stop", "--json")


def test_a_followed_turn_and_the_conversation_show_the_text_literally(
    fleet: Any, store: Store
) -> None:
    sid = sessions.create_session(store, _cwd()).session_id
    followed = _run("prompt", sid, f"say {RAW}")
    assert RAW in followed.stdout.splitlines(), followed.stdout
    shown = _run("sessions", "show", sid).stdout.splitlines()
    assert f"> say {RAW}" in shown and RAW in shown, shown
