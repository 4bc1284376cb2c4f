"""``fleet archive --bulk`` (``api/cli/archive.py``, ``api/cli/bulk.py``) in process with typer's
``CliRunner``, against the real test Redis; the CLI talks to the orchestrator directly."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

import api.cli.bulk
from api.cli import app
from orchestrator.archiving import archive, bulk
from orchestrator.errors import StoreUnavailable
from orchestrator.reminder import reminders
from orchestrator.session import scripts as session_scripts
from orchestrator.session import sessions
from orchestrator.storage.store import Store, iso, now_ms
from tests.orchestrator.test_bulk import backdate

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")


def _run(
    *args: str, input: str | bytes | None = None, codes: tuple[int, ...] = (0, 1, 2)
) -> Result:
    result = runner.invoke(app, list(args), input=input)
    assert "Traceback" not in result.output, result.output
    assert result.exit_code in codes, (result.exit_code, result.output, result.exception)
    return result


def _json(*args: str, input: str | None = None) -> dict[str, Any]:
    result = _run(*args, "--json", input=input)
    assert result.exit_code in (0, 1), result.output
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def _cwd() -> str:
    return f"/tmp/fleet-cli-bulk/{uuid.uuid4().hex}"


def _new(store: Store, cwd: str, title: str | None = None, parent: str | None = None) -> str:
    sid = sessions.create_session(store, cwd, parent_id=parent).session_id
    if title:
        session_scripts.set_title(store, session_id=sid, title=title, source="client")
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


def test_a_malformed_id_is_printed_by_its_first_80_characters(store: Store) -> None:
    # Given a real session and an id of 100,000 characters
    sid, huge = _new(store, _cwd()), "a" * 100_000
    # When they are archived in bulk, as JSON and for a person
    body = _json("bulk-archive", "--dry-run", sid, huge)
    human = _run("bulk-archive", "--dry-run", sid, huge)
    # Then the malformed id is quoted by its first 80 characters, as the API answers it
    assert body["results"] == [
        {"sessionId": sid, "outcome": "archived"},
        {"sessionId": "a" * 80, "outcome": "not_found"},
    ]
    assert f"not found: {'a' * 80}\n" in human.stdout, human.stdout[:300]
    assert "a" * 81 not in human.stdout
    assert f"would archive {sid}" in human.stdout


def test_an_ids_file_with_a_byte_order_mark_archives_its_first_id(
    store: Store, tmp_path: Path
) -> None:
    # Given an ids file an editor saved with a UTF-8 byte-order mark
    cwd = _cwd()
    first, second = _new(store, cwd), _new(store, cwd)
    path = tmp_path / "ids.txt"
    path.write_bytes(b"\xef\xbb\xbf" + f"{first}\r\n{second}\r\n".encode())
    # When it is archived in bulk
    body = _json("bulk-archive", "--ids-file", str(path))
    # Then both ids are archived: the mark is not part of the first
    assert body["totals"]["archived"] == 2, body
    assert _archived(store, first) and _archived(store, second)


def test_ids_that_name_nothing_are_printed_escaped_and_all_counted(store: Store) -> None:
    # Given ids with a control sequence, a NUL and a byte-order mark, and 205 more unknown ids
    odd = ["x\x1b[31mred", "nul\x00", "\ufeffsess_" + "0" * 24]
    unknown = [f"sess_{n:024x}" for n in range(205)]
    # When they are archived in bulk for a person
    human = _run("bulk-archive", *odd, *unknown)
    # Then nothing reaches the terminal raw: each shows as its escape
    assert "\x1b" not in human.stdout and "\x00" not in human.stdout, repr(human.stdout[:300])
    assert r"x\x1b[31mred, nul\x00, \ufeffsess_" in human.stdout, human.stdout[:300]
    # And the list, cut at 200 names, says how many it left out
    assert "... and 8 more (--json lists all)" in human.stdout
    assert human.exit_code == 1


def test_live_item_labels_reach_the_terminal_escaped(store: Store) -> None:
    # Given a live reminder whose text (a client's or a model's) carries terminal controls:
    # a window title, a clipboard write, invisible text, a line-up, a right-to-left override
    sid = _new(store, _cwd())
    text = "hi \x1b]0;PWNED\x07\x1b]52;c;ZXZpbA==\x07\x1b[8mhidden\x1bM\u202eevil"
    reminders.create_reminder(store, sid, 3600, text)
    # When every command that lists live items prints it for a person
    outputs = [
        _run("activity", sid).stdout,
        _run("sessions", "show", sid).stdout,
        _run("archive", sid).stderr,  # refused: the live items follow the error
        _run("bulk-archive", sid).stdout,  # refused: listed with its live items
    ]
    # Then none of the controls reaches it raw; each shows as its escape
    for out in outputs:
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, repr(out)
        assert r"hi \x1b]0;PWNED\x07\x1b]52;c;ZXZpbA==\x07\x1b[8mhidden\x1bM\u202eevil" in out


def test_an_ids_file_path_is_echoed_escaped() -> None:
    result = _run("bulk-archive", "--ids-file", "no\x1b[31mRED\u202efile")
    assert result.exit_code == 2
    assert "\x1b" not in result.stderr and "\u202e" not in result.stderr, repr(result.stderr)
    assert r"no\x1b[31mRED\u202efile" in result.stderr


def test_a_delete_prints_a_malformed_id_escaped_and_quoted_by_80_characters() -> None:
    for raw, shown in [("x" * 5000, "x" * 80), ("x\x1b[31my", r"x\x1b[31my")]:
        result = _run("delete", raw)
        assert result.exit_code == 0, result.output
        assert result.stdout == f"{shown}: nothing to delete\n", repr(result.stdout[:200])


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


@pytest.fixture
def bar_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """What the progress bar is told, ``(done, total)`` per call, as it shows it."""
    seen: list[tuple[int, int]] = []
    original = api.cli.bulk._Bar.__call__

    def spy(self: Any, done: int, total: int) -> None:
        seen.append((done, total))
        original(self, done, total)

    monkeypatch.setattr(api.cli.bulk._Bar, "__call__", spy)
    return seen


def test_a_progress_bar_counts_the_sessions(store: Store, bar_calls: list[tuple[int, int]]) -> None:
    ids = [_new(store, _cwd()) for _ in range(3)]
    assert _run("archive", "--bulk", *ids).exit_code == 0
    assert bar_calls == [(0, 3), (3, 3)], "sessions done, of all"


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


def test_more_ids_than_one_request_takes_are_all_archived_not_refused(
    store: Store, tmp_path: Path
) -> None:
    # Given a file of one id more than a request takes, a session of ours among them at the end
    sid = _new(store, _cwd())
    unknown = [f"sess_{i:024d}" for i in range(bulk.MAX_IDS)]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join([*unknown, sid]))
    # When it is archived
    result = _run("bulk-archive", "--ids-file", str(ids_file))
    # Then every id is answered, in two requests, the unknown ones not found: exit 1
    assert result.exit_code == 1, result.output[-500:]
    assert "too_many_sessions" not in result.output
    said = result.stdout.splitlines()[0]
    assert "archived 1," in said and f"not found {bulk.MAX_IDS}" in said, said
    assert f"selected {bulk.MAX_IDS + 1}" in said and "in 2 requests" in said, said
    assert _archived(store, sid)


@pytest.fixture
def cap(monkeypatch: pytest.MonkeyPatch) -> int:
    """The most ids one request takes (``orchestrator.archiving.bulk.MAX_IDS``, which the server
    checks
    too) lowered to 3 for one test, so a few sessions need several requests."""
    monkeypatch.setattr(bulk, "MAX_IDS", 3)
    return 3


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The ids of each request the CLI sends (``orchestrator.archiving.bulk.bulk_archive`` spied
    on)."""
    sent: list[list[str]] = []
    real = bulk.bulk_archive

    def spy(*args: Any, **kwargs: Any) -> bulk.BulkResult:
        sent.append(list(kwargs["session_ids"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(bulk, "bulk_archive", spy)
    return sent


def test_ids_over_the_cap_go_in_several_requests_answered_as_one(
    store: Store, tmp_path: Path, cap: int, requests: list[list[str]]
) -> None:
    # Given 7 sessions and an unknown id in a file, 3 ids a request
    cwd = _cwd()
    ids = [_new(store, cwd) for _ in range(7)]
    missing = "sess_" + "0" * 24
    given = [*ids[:4], missing, *ids[4:]]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(given))
    # When they are archived
    body = _json("bulk-archive", "--ids-file", str(ids_file))
    # Then three requests of at most 3 took every id once
    assert [len(part) for part in requests] == [3, 3, 2]
    assert sorted(sid for part in requests for sid in part) == sorted(given)
    # And one answer came back: results in the order given, totals and batches over all
    assert [r["sessionId"] for r in body["results"]] == given
    assert body["totals"] == {
        "archived": 7,
        "already_archived": 0,
        "refused": 0,
        "not_found": 1,
        "skipped": 0,
        "selected": 8,
    }
    assert body["batches"] == 3 and body["dryRun"] is False
    assert all(_archived(store, sid) for sid in ids)


def test_the_exit_status_over_several_requests_is_that_of_one(
    store: Store, cap: int, requests: list[list[str]]
) -> None:
    # Given 5 sessions, the last one busy: it goes in the second request
    cwd = _cwd()
    quiet = [_new(store, cwd) for _ in range(4)]
    busy = _new(store, cwd)
    rid = reminders.create_reminder(store, busy, 60, "check the build")
    # When a dry run reports them: exit 0, nothing written
    dry = _run("bulk-archive", *quiet, busy, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: would archive 4" in dry.stdout and "refused 1" in dry.stdout
    assert len(requests) == 2 and not any(_archived(store, sid) for sid in quiet)
    # When they are archived: the refusal of the second request makes it exit 1, listed
    result = _run("bulk-archive", *quiet, busy)
    assert result.exit_code == 1, result.output
    out = " ".join(result.stdout.split())
    assert "archived 4" in out and "refused 1" in out and "in 2 requests" in out, out
    assert busy in out and rid in out
    # When it is archived again with --stop: exit 0, and the stops sent are reported
    again = _run("bulk-archive", *quiet, busy, "--stop")
    assert again.exit_code == 0, again.output
    assert "already archived 4" in again.stdout and "stops sent: reminder 1" in again.stdout


def test_duplicates_across_the_request_boundary_count_once(
    store: Store, cap: int, requests: list[list[str]]
) -> None:
    # Given 4 sessions named 7 times: a, b, c | a, d, b, d
    cwd = _cwd()
    a, b, c, d = (_new(store, cwd) for _ in range(4))
    body = _json("bulk-archive", a, b, c, a, d, b, d)
    # Then each went out once, the first copy kept, and is counted once, as one request does
    assert requests == [[a, b, c], [d]]
    assert [r["sessionId"] for r in body["results"]] == [a, b, c, d]
    assert body["totals"]["archived"] == 4 and body["totals"]["selected"] == 4


def test_a_subtree_over_several_requests_is_archived_in_its_roots_transition(
    store: Store, cap: int, requests: list[list[str]]
) -> None:
    # Given a parent and its child named last and first, with 5 roots between them
    cwd = _cwd()
    parent = _new(store, cwd)
    child = _new(store, cwd, parent=parent)
    others = [_new(store, cwd) for _ in range(5)]
    body = _json("bulk-archive", child, *others, parent)
    # Then the roots went out first (in the order named), the child in the last request
    assert requests == [others[:3], [*others[3:], parent], [child]]
    # And the parent archived it in its own transition, as one request would
    assert [r["sessionId"] for r in body["results"]] == [child, *others, parent]
    assert {r["sessionId"]: r["outcome"] for r in body["results"]}[child] == "already_archived"
    # And unarchiving the parent restores the child with it
    assert archive.unarchive(store, parent) == 2
    assert not _archived(store, child)


def test_one_progress_bar_counts_the_sessions_of_every_request(
    store: Store, cap: int, bar_calls: list[tuple[int, int]]
) -> None:
    ids = [_new(store, _cwd()) for _ in range(7)]
    assert _run("bulk-archive", *ids, ids[0]).exit_code == 0
    assert bar_calls == [(0, 7), (3, 7), (6, 7), (7, 7)], "sessions done, of all"


def _second_request_ends(monkeypatch: pytest.MonkeyPatch, end: Callable[[], None]) -> None:
    """The second request writes its first session, then ``end()`` stops it (it must raise)."""
    real = bulk.bulk_archive
    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> bulk.BulkResult:
        calls.append(1)
        if len(calls) == 2:
            real(*args, **{**kwargs, "session_ids": kwargs["session_ids"][:1]})
            end()
            raise AssertionError("the second request was not ended")
        return real(*args, **kwargs)

    monkeypatch.setattr(bulk, "bulk_archive", flaky)


def _failing_second_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second request writes its first session, then Redis fails."""

    def lost() -> None:
        raise StoreUnavailable("Redis is unavailable (ConnectionError: lost).")

    _second_request_ends(monkeypatch, lost)


def test_a_request_failing_midway_reports_what_was_done_and_what_was_not_sent(
    store: Store, cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 8 sessions (3 requests) and a second request that fails after one write
    cwd = _cwd()
    ids = [_new(store, cwd) for _ in range(8)]
    _failing_second_request(monkeypatch)
    # When they are archived
    result = _run("bulk-archive", *ids)
    # Then it exits 2 with the error, after printing what the first request did
    assert result.exit_code == 2, result.output
    assert "archived 3," in result.stdout and "selected 3" in result.stdout, result.stdout
    said = " ".join(result.stderr.split())
    assert "error (store_unavailable):" in said and "ConnectionError: lost" in said, said
    assert "request 2 of 3 failed: 3 of 8 sessions done" in said, said
    assert "5 not confirmed: 3 in that request" in said and "2 not sent" in said, said
    # And every id not confirmed is named, none lost
    assert "not confirmed: " + ", ".join(ids[3:]) in said, said
    assert all(_archived(store, sid) for sid in ids[:4])
    assert not any(_archived(store, sid) for sid in ids[4:])
    # And running it again finishes the rest
    monkeypatch.undo()
    body = _json("bulk-archive", *ids)
    assert body["totals"]["already_archived"] == 4 and body["totals"]["archived"] == 4


def test_ctrl_c_during_a_later_request_reports_the_ids_left_and_exits_130(
    store: Store, cap: int, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # Given 8 sessions (3 requests); the second writes one session, then the process gets
    # a real SIGINT (what Ctrl-C sends)
    cwd = _cwd()
    ids = [_new(store, cwd) for _ in range(8)]

    # A suite started in the background inherits SIGINT ignored, and then no
    # KeyboardInterrupt would come: the handler a terminal gives Python, for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    def ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(10)  # the signal's KeyboardInterrupt ends this wait

    _second_request_ends(monkeypatch, ctrl_c)
    # When they are archived
    result = _run("bulk-archive", *ids, codes=(130,))
    # Then the run stops there, says so, and names every id it did not confirm
    said = " ".join(result.stderr.split())
    assert "error (interrupted):" in said, said
    assert "request 2 of 3 was interrupted: 3 of 8 sessions done" in said, said
    assert "not confirmed: " + ", ".join(ids[3:]) in said, said
    assert not any(_archived(store, sid) for sid in ids[4:])


def test_a_request_failing_midway_is_one_json_error_listing_the_ids_left(
    store: Store, cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = _cwd()
    ids = [_new(store, cwd) for _ in range(8)]
    _failing_second_request(monkeypatch)
    result = _run("bulk-archive", *reversed(ids), "--json")
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "store_unavailable"
    data = error["data"]
    assert data["failedRequest"] == 2 and data["requests"] == 3
    # Every id, in the order given: done by the first request, unconfirmed, or not sent
    given = ids[::-1]
    assert [r["sessionId"] for r in data["done"]["results"]] == given[:3]
    assert data["done"]["totals"]["archived"] == 3
    assert data["unconfirmed"] == given[3:6] and data["notSent"] == given[6:]


def test_a_failure_of_the_only_request_is_the_plain_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*args: Any, **kwargs: Any) -> bulk.BulkResult:
        raise StoreUnavailable("Redis is unavailable (ConnectionError: lost).")

    monkeypatch.setattr(bulk, "bulk_archive", down)
    result = _run("bulk-archive", _new(store, _cwd()), "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["data"] == {}


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
    assert "holds more than 16 MiB" in message and "split the file" in message, message


def test_ids_on_stdin_over_the_cap_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.cli.bulk, "MAX_IDS_FILE_BYTES", 64)
    result = _run("bulk-archive", "--ids-file", "-", "--dry-run", input="sess_x\n" * 20)
    assert result.exit_code == 2
    assert "holds more than" in " ".join(result.output.split())
