"""``fleet archive`` (one session, or many with ``--bulk``/``--auto``), ``fleet unarchive`` and
``fleet delete`` (which stops work as ``fleet archive --stop`` does)."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from api.cli.common import app, console, fail, item_line, shown_id, usage
from api.cli.params import seconds_option
from orchestrator.errors import FleetError

#: ``--json`` of ``archive``, ``unarchive`` and ``delete``: the outcome as the HTTP API
#: answers it, and a refusal as ``{"error": ...}`` on stdout (``api.cli.common.fail``).
_JSON = typer.Option(False, "--json", help="Print JSON (for scripts).")


def _confirmed_option(refused: str) -> Any:
    """The ``--confirmed FAMILY:ID`` option of a command whose ``refused`` (archive, delete)
    ``--stop`` binds to what the user confirmed."""
    return typer.Option(
        None,
        "--confirmed",
        metavar="FAMILY:ID",
        help="With --stop: an item confirmed for stopping (repeat it); anything "
        f"else live refuses the {refused} (activity_changed) and nothing is written.",
        show_default=False,
    )


@app.command()
def archive(
    ids: list[str] | None = typer.Argument(
        None, metavar="ID", help="The session to archive.", show_default=False
    ),
    stop: bool = typer.Option(False, "--stop", help="Stop live work, then archive."),
    confirmed: list[str] | None = _confirmed_option("archive"),
    as_json: bool = _JSON,
    # The spellings before `fleet bulk-archive` and `fleet auto-archive`, still served.
    bulk: bool = typer.Option(False, "--bulk", hidden=True),
    ids_file: str | None = typer.Option(None, "--ids-file", hidden=True),
    cwd: str | None = typer.Option(None, "--cwd", hidden=True),
    idle_since: str | None = typer.Option(None, "--idle-since", hidden=True),
    q: str | None = typer.Option(None, "--q", hidden=True),
    dry_run: bool = typer.Option(False, "--dry-run", hidden=True),
    auto: bool = typer.Option(False, "--auto", hidden=True),
    idle_seconds: float = seconds_option(0, "--idle-seconds", hidden=True),
) -> None:
    """Archive a session. Refused while it has live work unless --stop is given. With --stop
    on a terminal, the live items are listed and the archive stops exactly what was confirmed:
    if other work started meanwhile, nothing is written and the new list is printed.

    Many sessions at once: fleet bulk-archive; the auto-archive policy: fleet auto-archive
    (fleet archive --bulk and --auto still work as they did). Exit status: 0 archived (or
    already), 1 declined at the confirmation, 2 refused (with --json, as JSON on stdout).
    """
    if bulk or auto:
        from api.cli.bulk import Selection, run_auto, run_bulk

        selected = Selection(ids or [], ids_file, cwd, idle_since, q, stop, dry_run, as_json)
        if auto:
            run_auto(selected, bulk=bulk, idle_seconds=idle_seconds)
        else:
            run_bulk(selected)
        return
    given = {
        "--ids-file": ids_file is not None,
        "--cwd": cwd is not None,
        "--idle-since": idle_since is not None,
        "--q": q is not None,
        "--dry-run": dry_run,
        "--idle-seconds": bool(idle_seconds),
    }
    _archive_one(_one_session(ids, given), stop, confirmed, as_json)


def _one_session(ids: list[str] | None, given: dict[str, bool]) -> str:
    """The one session id a plain ``fleet archive`` takes; exits 2 naming the bulk-only
    options given (``given``: option name -> whether it was given) or a wrong count of ids."""
    extra = [name for name, present in given.items() if present]
    if extra or len(ids or []) != 1:
        usage(
            "give one session id"
            + (f" ({', '.join(extra)} needs bulk-archive or auto-archive)" if extra else "")
            + "; several sessions or a filter need `fleet bulk-archive`."
        )
    return (ids or [""])[0]


def _archive_one(session_id: str, stop: bool, confirmed: list[str] | None, as_json: bool) -> None:
    """Archive one session (``--stop``: stop its live work, bound to what was confirmed) and
    print the outcome; a refusal exits 2."""
    from api.context import dispatcher, store
    from orchestrator.archiving.archive import archive as do_archive

    try:
        binding = _confirmation(session_id, stop, confirmed, as_json, "archive")
        result = do_archive(
            store(), dispatcher(), session_id, stop_activity=stop, confirmed=binding
        )
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(result.to_wire(), indent=2))
        return
    console.print(
        f"{session_id}: {result.outcome.replace('_', ' ')}"
        + (f", stop sent for {len(result.stopped)} item(s)" if result.stopped else "")
    )


def _confirmation(
    session_id: str, stop: bool, given: list[str] | None, as_json: bool, verb: str
) -> list[tuple[str, str]] | None:
    """What ``fleet archive --stop`` (``fleet delete --stop``: ``verb``) is bound to: the
    ``--confirmed FAMILY:ID`` items, or on a terminal (without ``--json``) the live items
    shown and confirmed here; None (stop everything live) for a script that names none.
    Raises ``InvalidParams`` for a malformed item or --confirmed without --stop,
    ``SessionNotFound``; exits 1 when the user declines."""
    from api.context import dispatcher, store
    from orchestrator.census.activity import census
    from orchestrator.errors import InvalidParams
    from orchestrator.families import names

    if given:
        if not stop:
            raise InvalidParams("--confirmed needs --stop.", {"param": "confirmed"})
        pairs = [tuple(item.partition(":")[::2]) for item in given]
        bad = [
            item for item, (fam, ident) in zip(given, pairs, strict=True) if not fam or not ident
        ]
        if bad:
            raise InvalidParams(
                f"--confirmed takes FAMILY:ID items (turn:turn_..., job:job_...); got {bad[0]!r}.",
                {"param": "confirmed"},
            )
        unknown = [item for item, (fam, _) in zip(given, pairs, strict=True) if fam not in names()]
        if unknown:
            raise InvalidParams(
                f"--confirmed item {unknown[0]!r} names no family; the families are "
                f"{', '.join(names())}.",
                {"param": "confirmed"},
            )
        return [(family, item_id) for family, item_id in pairs]
    if not stop or as_json or not sys.stdin.isatty():
        return None
    items = census(store(), session_id, dispatcher())
    if items:
        console.print(f"{session_id} has live work:")
        for item in items:
            console.print(f"  - {item_line(item)}", highlight=False)
        if not typer.confirm(f"Stop these {len(items)} item(s) and {verb}?", default=False):
            raise typer.Exit(1)
    return [(item.family, item.id) for item in items]


@app.command()
def unarchive(session_id: str, as_json: bool = _JSON) -> None:
    """Unarchive a session (restores nothing that was stopped). Exit status: 0 unarchived (or
    was not archived), 2 refused (with --json, as JSON on stdout)."""
    from api.context import store
    from orchestrator.archiving.archive import unarchive as do_unarchive
    from orchestrator.archiving.archive import unarchive_to_wire

    try:
        n = do_unarchive(store(), session_id)
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(unarchive_to_wire(session_id, n), indent=2))
        return
    console.print(f"{session_id}: " + ("unarchived" if n else "was not archived"))


@app.command()
def delete(
    session_id: str = typer.Argument(..., metavar="ID", help="The session to delete."),
    stop: bool = typer.Option(
        False, "--stop", help="Stop live work (as archive --stop), then delete."
    ),
    confirmed: list[str] | None = _confirmed_option("delete"),
    as_json: bool = _JSON,
) -> None:
    """Delete a session and its subagents (its whole subtree). Refused, with the live items,
    while any of them has live work unless --stop is given: then the work is stopped as
    fleet archive --stop stops it (on a terminal the live items are listed and confirmed
    first), and the session is deleted once it has ended (20 seconds at
    most; work still live then refuses the delete and the session stays archived).
    Idempotent: an unknown or deleted session answers "nothing to delete". Exit status: 0
    deleted (or nothing to delete), 1 declined at the confirmation, 2 refused (with --json,
    as JSON on stdout; the deleted answer is the HTTP API's).
    """
    from api.context import dispatcher, store
    from orchestrator.archiving.deletion import delete as do_delete
    from orchestrator.errors import SessionNotFound

    try:
        try:
            binding = _confirmation(session_id, stop, confirmed, as_json, "delete")
        except SessionNotFound:
            binding = None  # nothing to confirm: the delete answers that there is nothing
        result = do_delete(store(), dispatcher(), session_id, stop_activity=stop, confirmed=binding)
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(result.to_wire(), indent=2))
        return
    below = len(result.deleted_descendants)
    console.print(
        f"{shown_id(session_id)}: "
        + ("deleted" if result.deleted else "nothing to delete")
        + (f" with {below} subagent session(s)" if below else "")
        + (f", stop sent for {len(result.stopped)} item(s)" if result.stopped else "")
    )
