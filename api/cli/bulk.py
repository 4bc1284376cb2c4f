"""``fleet bulk-archive`` and ``fleet auto-archive`` (also spelled ``fleet archive --bulk`` and
``fleet archive --auto``): many sessions at once, talking to the orchestrator directly like the
other commands. A progress bar (sessions done, of all) goes to
stderr when it is a terminal, so ``--json`` output on stdout stays clean for scripts. Ids of
any number go out in requests of at most the server's cap and come back as one answer
(``api/cli/bulk_ids.py``).

Exit status: 0 when every selected session ended archived (or already was), and for every dry
run (it only reports); 1 when some were refused, not found or skipped; 2 when the request
itself was refused (bad arguments, a filter selecting too many, Redis unavailable), or when
one of several requests failed (what the earlier ones did is printed, and the ids not
confirmed are counted; ``--json`` lists them in the error's ``data``); 130, with the same
report, when one of several was interrupted (Ctrl-C).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from api.cli.bulk_ids import Split
from api.cli.common import app, cli_words, console, err, item_line, printable, shown_id, usage, when
from api.cli.params import seconds_option
from api.cli.tables import fitted, show
from orchestrator.archiving.bulk import BulkResult
from orchestrator.errors import FleetError

#: Sessions listed by name in human output; ``--json`` lists them all.
_LISTED = 200


#: The largest ``--ids-file`` read, in bytes: some 500,000 ids of 30 characters (50 requests
#: of ``orchestrator.archiving.bulk.MAX_IDS``), and far below what would exhaust memory
# (``/dev/zero``
#: or a stream that never ends is refused once this much was read).
MAX_IDS_FILE_BYTES = 16 * 1024 * 1024


def read_ids(path: str) -> list[str]:
    """Session ids from a file (``-``: stdin), one a line; blank lines, ``#`` comments and a
    leading byte-order mark are skipped. A file that cannot be read, is not UTF-8 or holds
    more than ``MAX_IDS_FILE_BYTES`` is a usage error (exit 2) saying why."""
    try:
        if path != "-":
            with Path(path).open("rb") as stream:
                raw = stream.read(MAX_IDS_FILE_BYTES + 1)
        elif hasattr(sys.stdin, "buffer"):
            raw = sys.stdin.buffer.read(MAX_IDS_FILE_BYTES + 1)
        else:  # a text stream standing in for stdin
            raw = sys.stdin.read(MAX_IDS_FILE_BYTES + 1).encode("utf-8", "surrogateescape")
        if len(raw) > MAX_IDS_FILE_BYTES:
            most = MAX_IDS_FILE_BYTES // (1024 * 1024)
            usage(
                f"--ids-file {printable(path)} holds more than {most} MiB, the most one "
                "bulk-archive reads: split the file."
            )
        text = raw.decode("utf-8")
    except OSError as exc:
        usage(f"cannot read --ids-file {printable(path)}: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        usage(f"cannot read --ids-file {printable(path)}: {_not_utf8(exc)}")
    out: list[str] = []
    # A byte-order mark (editors on Windows write one) is not part of the first id.
    for line in text.removeprefix("\ufeff").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """Where UTF-8 decoding stopped: the byte, its line and its offset in the file."""
    data = bytes(exc.object)
    line = data.count(b"\n", 0, exc.start) + 1
    return (
        f"not UTF-8 text: byte 0x{data[exc.start]:02x} on line {line} "
        f"(offset {exc.start}): {exc.reason}."
    )


class _Bar:
    """A rich progress bar of sessions on stderr (nothing when stderr is not a terminal)."""

    def __init__(self, label: str) -> None:
        self.progress = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("sessions"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        )
        self.task: Any = None

    def __enter__(self) -> _Bar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.progress.add_task("sessions", total=max(total, 1))
        self.progress.update(self.task, completed=done, total=max(total, 1))


def _summary(result: BulkResult, requests: int = 1) -> str:
    t = result.totals
    verb = "would archive" if result.dry_run else "archived"
    parts = [f"{verb} {t['archived']}", f"already archived {t['already_archived']}"]
    parts += [f"refused {t['refused']}", f"not found {t['not_found']}"]
    if t["skipped"]:
        parts.append(f"skipped {t['skipped']} (active again)")
    head = "dry run: " if result.dry_run else ""
    plural = "es" if result.batches != 1 else ""
    sent = f" in {requests} requests" if requests > 1 else ""
    return (
        f"{head}{', '.join(parts)} (selected {t['selected']}, {result.batches} batch{plural}{sent})"
    )


def _print_human(result: BulkResult, requests: int = 1) -> None:
    console.print(_summary(result, requests))
    refused = [i for i in result.results if i.outcome == "refused"]
    if refused:
        console.print("refused (live work; --stop stops it):")
        for item in refused[:_LISTED]:
            console.print(f"  {item.session_id}")
            for a in item.activity or []:
                console.print(f"    - {item_line(a)}", highlight=False)
    missing = [shown_id(i.session_id) for i in result.results if i.outcome == "not_found"]
    if missing:
        more = f" ... and {len(missing) - _LISTED} more (--json lists all)"
        console.print(
            "not found: " + ", ".join(missing[:_LISTED]) + (more if len(missing) > _LISTED else "")
        )
    if result.dry_run:
        would = [i.session_id for i in result.results if i.outcome == "archived"]
        for sid in would[:_LISTED]:
            console.print(f"  would archive {sid}")
        if len(would) > _LISTED:
            console.print(f"  ... and {len(would) - _LISTED} more (--json lists all)")
    sent = result.stop_report.sent
    if sent:
        console.print("stops sent: " + ", ".join(f"{fam} {n}" for fam, n in sorted(sent.items())))
    for family, error in result.stop_report.failed:
        err.print(
            Text.assemble(("warning", "yellow"), f": stop dispatch for {family} failed: {error}")
        )


def _finish(result: BulkResult, as_json: bool, *, strict: bool, requests: int = 1) -> None:
    if as_json:
        print(json.dumps(result.to_wire(), indent=2))
    else:
        _print_human(result, requests)
    t = result.totals
    if strict and not result.dry_run and (t["refused"] or t["not_found"] or t["skipped"]):
        raise typer.Exit(1)


@dataclass(frozen=True)
class Selection:
    """What a bulk or auto archive was given: session ``ids`` and ``ids_file``, the filter
    (``cwd``, ``idle_since``, ``q``), and ``stop``, ``dry_run`` and ``as_json``."""

    ids: list[str] = field(default_factory=list)
    ids_file: str | None = None
    cwd: str | None = None
    idle_since: str | None = None
    q: str | None = None
    stop: bool = False
    dry_run: bool = False
    as_json: bool = False


def run_bulk(given: Selection) -> None:
    """``fleet bulk-archive`` (and ``fleet archive --bulk``)."""
    from api.cli.bulk_ids import archive_ids
    from api.context import dispatcher, store
    from orchestrator.archiving.bulk import BulkFilter, bulk_archive

    named = list(given.ids) + (read_ids(given.ids_file) if given.ids_file is not None else [])
    filtered = given.cwd is not None or given.idle_since is not None or given.q is not None
    if named and filtered:
        usage("give session ids (or --ids-file) or a filter (--cwd, --idle-since, --q), not both.")
    if not named and not filtered and given.ids_file is None:
        usage("bulk-archive needs session ids, --ids-file, or a filter (--cwd, --idle-since, --q).")
    with _Bar("dry run" if given.dry_run else "archiving") as bar:
        if filtered:
            result = bulk_archive(
                store(),
                dispatcher(),
                flt=BulkFilter(given.cwd, given.idle_since, given.q),
                stop_activity=given.stop,
                dry_run=given.dry_run,
                progress=bar,
            )
        else:
            split = archive_ids(
                store(),
                dispatcher(),
                named,
                stop_activity=given.stop,
                dry_run=given.dry_run,
                progress=bar,
            )
    if filtered:
        _finish(result, given.as_json, strict=True)
    elif split.unfinished is not None:
        _unfinished(split, given.as_json)
    else:
        _finish(split.result, given.as_json, strict=True, requests=split.requests)


def _unfinished(split: Split, as_json: bool) -> NoReturn:
    """A run over several requests that one of them ended: the error, what the requests
    before it did and the ids not confirmed (with ``--json``, one error document whose
    ``data`` holds them all), exit 2 (130 when it was interrupted, as a shell counts SIGINT)."""
    from api.cli.bulk_ids import Interrupted
    from api.errors import error_body

    stopped = split.unfinished
    assert stopped is not None
    exc, result = stopped.error, split.result
    message = cli_words(exc.message)
    interrupted = isinstance(exc, Interrupted)
    status = 130 if interrupted else 2
    if as_json:
        data = {
            **exc.data,
            "failedRequest": stopped.failed,
            "requests": stopped.requests,
            "done": result.to_wire(),
            "unconfirmed": stopped.unconfirmed,
            "notSent": stopped.not_sent,
        }
        print(json.dumps(error_body(exc.code, message, data), indent=2))
        raise typer.Exit(status)
    above = " (above)" if result.results else ""
    if result.results:
        _print_human(result, stopped.failed - 1)
    left = stopped.unconfirmed + stopped.not_sent
    err.print(Text.assemble(("error", "red"), f" ({exc.code}): {message}"))
    err.print(
        f"request {stopped.failed} of {stopped.requests} "
        f"{'was interrupted' if interrupted else 'failed'}: "
        f"{len(result.results)} of {split.given} sessions done{above}, {len(left)} not "
        f"confirmed: {len(stopped.unconfirmed)} in that request (it may have archived "
        f"some), {len(stopped.not_sent)} not sent. Run the same command again to finish: "
        "sessions already archived answer already archived.",
        highlight=False,
    )
    listed = ", ".join(shown_id(sid) for sid in left[:_LISTED])
    more = f" ... and {len(left) - _LISTED} more (--json lists all)" if len(left) > _LISTED else ""
    err.print(f"not confirmed: {listed}{more}", highlight=False)
    raise typer.Exit(status)


def run_auto(given: Selection, *, bulk: bool = False, idle_seconds: float = 0) -> None:
    """``fleet archive --auto [--dry-run] [--cwd DIR] [--idle-seconds N]``: one run of the
    auto-archive policy; a dry run prints the sessions it would archive."""
    from api.context import dispatcher, store
    from orchestrator.archiving.bulk import auto_archive
    from orchestrator.session.sessions import get_session

    named = given.ids or given.ids_file is not None
    if bulk or named or given.idle_since is not None or given.q is not None or given.stop:
        usage(
            "--auto selects by idle age (--idle-seconds, --cwd) and never stops work; it takes "
            "no ids, --bulk, --idle-since, --q or --stop."
        )
    with _Bar("auto-archive dry run" if given.dry_run else "auto-archive") as bar:
        result = auto_archive(
            store(),
            dispatcher(),
            idle_seconds=idle_seconds or None,
            dry_run=given.dry_run,
            cwd=given.cwd,
            progress=bar,
        )
    if given.as_json or not given.dry_run:
        _finish(result, given.as_json, strict=False)
        return
    would = [i.session_id for i in result.results if i.outcome == "archived"]
    busy = [i for i in result.results if i.outcome == "refused"]
    console.print(
        f"dry run: would archive {len(would)} idle session(s); "
        f"{len(busy)} idle but with live work left alone"
    )
    if would:
        rows = []
        for sid in would[:_LISTED]:
            try:
                s = get_session(store(), sid)
            except FleetError:
                continue
            rows.append([sid, s.cwd, s.title, when(s.updated_at)])
        names = ["sessionId", "cwd", "title", "last activity"]
        table = fitted(
            names, rows, console.width, {1: 6, 2: 10}, ids=frozenset({0}), cut_start=frozenset({1})
        )
        show(console, table)
        if len(would) > _LISTED:
            console.print(f"... and {len(would) - _LISTED} more (--json lists all)")
    for item in busy[:_LISTED]:
        families = sorted({a.family for a in item.activity or []})
        console.print(f"  busy: {item.session_id} ({', '.join(families) or 'live work'})")


@app.command("bulk-archive")
def bulk_archive_command(
    ids: list[str] | None = typer.Argument(
        None, metavar="ID", help="Sessions to archive.", show_default=False
    ),
    ids_file: str | None = typer.Option(
        None, "--ids-file", metavar="FILE", help="A file of session ids, one a line ('-': stdin)."
    ),
    cwd: str | None = typer.Option(None, "--cwd", metavar="DIR", help="Filter: this directory."),
    idle_since: str | None = typer.Option(
        None,
        "--idle-since",
        metavar="TIME",
        help="Filter: last activity before this ISO 8601 time with an offset or Z.",
    ),
    q: str | None = typer.Option(None, "--q", metavar="TEXT", help="Filter: title contains it."),
    stop: bool = typer.Option(False, "--stop", help="Stop their live work, then archive."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would happen; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every session)."),
) -> None:
    """Archive many sessions in batches: those named (ids, --ids-file) or those a filter selects
    (--cwd, --idle-since, --q), with a progress bar on a terminal. A session with live work is
    refused unless --stop. Ids of any number: more than one request takes go out in several,
    ancestors first, and are answered as one. Exit status: 0 all archived (or already) and
    every dry run, 1 some refused, not found or skipped, 2 the request was refused or one of
    several failed, 130 one of several was interrupted (both list the ids not confirmed)."""
    run_bulk(Selection(ids or [], ids_file, cwd, idle_since, q, stop, dry_run, as_json))


@app.command("auto-archive")
def auto_archive_command(
    dry_run: bool = typer.Option(False, "--dry-run", help="List what it would archive."),
    cwd: str | None = typer.Option(None, "--cwd", metavar="DIR", help="Only this directory."),
    idle_seconds: float = seconds_option(
        0,
        "--idle-seconds",
        help="Idle age in seconds (required: the policy has no age of its own).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the auto-archive policy once: archive the sessions idle longer than the idle age
    that have no live work (it never stops work)."""
    run_auto(Selection(cwd=cwd, dry_run=dry_run, as_json=as_json), idle_seconds=idle_seconds)
