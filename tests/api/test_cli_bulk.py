"""``fleet archive --bulk`` (``api/cli/archive.py``, ``api/cli/bulk.py``) in process with typer's
``CliRunner``, against the real test Redis; the CLI talks to the orchestrator directly."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

import api.cli.bulk
from api.cli import app
from orchestrator import reminders, sessions
from orchestrator.store import Store, iso, now_ms
from tests.orchestrator.test_bulk import backdate

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")


def _run(*args: str, input: str | bytes | None = None) -> Result:
    result = runner.invoke(app, list(args), input=input)
    assert "Traceback" not in result.output, result.output
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output, result.exception)
    return result


def _json(*args: str, input: str | None = None) -> dict[str, Any]:
    result = _run(*args, "--json", input=input)
    assert result.exit_code in (0, 1), result.output
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def _cwd() -> str:
    return f"/tmp/fleet-cli-bulk/{uuid.uuid4().hex}"


def _new(store: Store, cwd: str, title: str | None = None) -> str:
    sid = sessions.create_session(store, cwd).session_id
    if title:
        store.run("set_title", [sid, title, "client"])
    return sid


def _archived(store: Store, sid: str) -> bool:
    return sessions.get_session(store, sid).archived


def test_bulk_archive_of_ids_prints_json_for_scripts(store: Store) -> None:
    cwd = _cwd()
    a, b = _new(store, cwd), _new(store, cwd)
    body = _json("archive", "--bulk", a, b, "sess_" + "0" * 24)
    assert body["totals"]["archived"] == 2 and body["totals"]["not_found"] == 1
    assert [r["sessionId"] for r in body["results"]][:2] == [a, b]
    assert _archived(store, a) and _archived(store, b)


def test_ids_can_come_from_a_file_or_stdin(store: Store, tmp_path: Path) -> None:
    cwd = _cwd()
    a, b, c = (_new(store, cwd) for _ in range(3))
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(f"# sessions to archive\n{a}\n\n  {b}  # the second\n")
    body = _json("archive", "--bulk", "--ids-file", str(ids_file))
    assert [r["sessionId"] for r in body["results"]] == [a, b]
    body = _json("archive", "--bulk", "--ids-file", "-", input=f"{c}\n")
    assert body["results"] == [{"sessionId": c, "outcome": "archived"}]


def test_a_dry_run_by_filter_writes_nothing_then_the_real_run_archives(store: Store) -> None:
    cwd = _cwd()
    old, recent = _new(store, cwd, "Old notes"), _new(store, cwd, "old news")
    backdate(store, old, now_ms() - 7_200_000)
    since = iso(now_ms() - 3_600_000)
    dry = _run("archive", "--bulk", "--cwd", cwd, "--q", "OLD", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: would archive 2" in dry.stdout
    assert f"would archive {old}" in dry.stdout and f"would archive {recent}" in dry.stdout
    assert not _archived(store, old) and not _archived(store, recent)
    body = _json("archive", "--bulk", "--cwd", cwd, "--idle-since", since)
    assert body["results"] == [{"sessionId": old, "outcome": "archived"}]
    assert not _archived(store, recent)


def test_refused_sessions_are_listed_with_their_live_items_and_exit_1(store: Store) -> None:
    cwd = _cwd()
    quiet, busy = _new(store, cwd), _new(store, cwd)
    rid = reminders.create_reminder(store, busy, 60, "check the build")
    result = _run("archive", "--bulk", quiet, busy)
    assert result.exit_code == 1
    out = " ".join(result.stdout.split())
    assert "archived 1" in out and "refused 1" in out
    assert busy in out and rid in out and "check the build" in out
    # With --stop it is archived, and the stop is reported
    stopped = _run("archive", "--bulk", "--stop", busy)
    assert stopped.exit_code == 0, stopped.output
    assert "stops sent: reminder 1" in stopped.stdout
    assert _archived(store, busy)


def test_a_progress_bar_counts_the_sessions(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    original = api.cli.bulk._Bar.__call__

    def spy(self: Any, done: int, total: int) -> None:
        seen.append((done, total))
        original(self, done, total)

    monkeypatch.setattr(api.cli.bulk._Bar, "__call__", spy)
    ids = [_new(store, _cwd()) for _ in range(3)]
    assert _run("archive", "--bulk", *ids).exit_code == 0
    assert seen == [(0, 3), (3, 3)], "sessions done, of all"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bulk"], "bulk-archive needs session ids"),
        (["--bulk", "sess_x", "--cwd", "/tmp"], "not both"),
        (["--bulk", "--idle-since", "yesterday"], "--idle-since must be an ISO 8601"),
        (["--bulk", "--cwd", "relative"], "absolute"),
        (["--bulk", "--ids-file", "/no/such/file"], "cannot read --ids-file"),
        (["a", "b"], "fleet bulk-archive"),
        (["--cwd", "/tmp"], "needs bulk-archive or auto-archive"),
        (["sess_x", "--dry-run"], "needs bulk-archive or auto-archive"),
        (["--auto", "--stop"], "never stops"),
        (["--auto", "sess_x"], "takes no ids"),
    ],
)
def test_usage_errors_exit_2_with_the_reason(args: list[str], needle: str) -> None:
    result = _run("archive", *args)
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split())


def test_too_many_ids_exit_2_with_the_cap(tmp_path: Path) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(f"sess_{i:024d}" for i in range(10_001)))
    result = _run("archive", "--bulk", "--ids-file", str(ids_file))
    assert result.exit_code == 2
    assert "too_many_sessions" in result.output and "10000" in result.output


def test_the_single_archive_still_works(store: Store) -> None:
    sid = _new(store, _cwd())
    result = _run("archive", sid)
    assert result.exit_code == 0 and "archived" in result.stdout
    assert json.loads(_run("archive", sid, "--json").stdout)["outcome"] == "already_archived"


def test_an_ids_file_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_bytes(b"sess_000000000000000000000001\nsess_\xff01\n")
    result = _run("bulk-archive", "--ids-file", str(ids_file), "--dry-run")
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert f"error (invalid_params): cannot read --ids-file {ids_file}" in said, said
    assert "0xff" in said and "line 2" in said and "offset 35" in said, said
    as_json = _run("bulk-archive", "--ids-file", str(ids_file), "--json")
    assert as_json.exit_code == 2, as_json.output
    assert json.loads(as_json.stdout)["error"]["code"] == "invalid_params", as_json.stdout
    from_stdin = _run("bulk-archive", "--ids-file", "-", input=ids_file.read_bytes())
    assert from_stdin.exit_code == 2, from_stdin.output
    assert "cannot read --ids-file -" in from_stdin.stderr, from_stdin.stderr


def test_an_ids_file_that_never_ends_is_refused_after_its_cap_not_read_to_the_end() -> None:
    # /dev/zero never ends: reading it whole would take all the memory there is.
    result = _run("bulk-archive", "--ids-file", "/dev/zero", "--dry-run", "--json")
    assert result.exit_code == 2, result.output[-300:]
    message = json.loads(result.stdout)["error"]["message"]
    assert "holds more than 16 MiB" in message and "10000" in message, message


def test_ids_on_stdin_over_the_cap_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.cli.bulk, "MAX_IDS_FILE_BYTES", 64)
    result = _run("bulk-archive", "--ids-file", "-", "--dry-run", input="sess_x\n" * 20)
    assert result.exit_code == 2
    assert "holds more than" in " ".join(result.output.split())
