"""``fleet sessions ls|show|new``, ``fleet activity`` and ``fleet audit``: reading sessions and
their work. Times read as people read them ("3 minutes ago"); ``--wide`` adds the local time
and ``--json`` gives the exact ISO 8601 instants."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from api.cli.common import (
    app,
    console,
    err,
    item_line,
    local_time,
    printable,
    sessions_app,
    usage,
    when,
)
from api.cli.keyed import KEY_OPTION, keyed_write
from api.cli.params import count_option
from api.cli.tables import fitted, show
from orchestrator.session.sessions import Session


def _sessions_table(sessions: list[Session], wide: bool, width: int) -> Table:
    """The ``sessions ls`` table in ``width`` characters: session and parent ids whole, the
    times as people read them, ``archived`` always; title and directory share what is left,
    cut with an ellipsis. ``wide`` adds the local time."""
    rows = [
        [
            s.session_id,
            s.title,
            s.cwd,
            when(s.updated_at),
            *([local_time(s.updated_at)] if wide else []),
            "yes" if s.archived else "",
            s.parent_id or "",
        ]
        for s in sessions
    ]
    names = ["sessionId", "title", "cwd", "updated", *(["updated (local)"] if wide else [])]
    names += ["archived", "parent"]
    ids = frozenset({0, len(names) - 1})
    return fitted(names, rows, width, {1: 10, 2: 6}, ids=ids, cut_start=frozenset({2}))


@sessions_app.command("ls")
def sessions_ls(
    all_: bool = typer.Option(False, "--all", help="Archived and not archived."),
    archived: bool = typer.Option(False, "--archived", help="Only archived sessions."),
    cwd: str | None = typer.Option(
        None, metavar="DIR", help="Only sessions in this directory (absolute)."
    ),
    wide: bool = typer.Option(False, "--wide", help="Also show the local time of each update."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (ISO 8601 UTC times)."),
) -> None:
    """List sessions, newest activity first (not archived ones unless --all or --archived)."""
    from api.context import store
    from orchestrator.session.sessions import list_sessions

    if all_ and archived:
        usage(
            "--all and --archived exclude each other: --all lists both, --archived only archived."
        )
    flt = "include" if all_ else "only" if archived else "exclude"
    sessions, cursor = [], None
    while True:
        page = list_sessions(store(), archived=flt, cwd=cwd, cursor=cursor, limit=200)
        sessions.extend(page.sessions)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    if as_json:
        print(json.dumps([s.to_info() for s in sessions], indent=2))
        return
    if not sessions:
        console.print("no sessions" + (f" in {cwd}" if cwd else ""), highlight=False)
        return
    show(console, _sessions_table(sessions, wide, console.width))


@sessions_app.command("show")
def sessions_show(
    session_id: str = typer.Argument(..., help="A session id (archived or not)."),
    limit: int = count_option(200, low=1, high=1000, help="Conversation updates, the latest."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one session, archived or not: its details, live work and conversation."""
    from api.context import store
    from orchestrator.census.activity import census
    from orchestrator.session.sessions import conversation, get_session

    s = get_session(store(), session_id)
    items = census(store(), s.session_id)
    updates = conversation(store(), s.session_id, limit)
    if as_json:
        body = {
            "session": s.to_info(),
            "activity": [i.to_wire() for i in items],
            "conversation": updates,
        }
        print(json.dumps(body, indent=2))
        return
    rows: list[tuple[str, str]] = [
        ("session", s.session_id),
        ("title", s.title or "(none)"),
        ("cwd", s.cwd),
        ("archived", f"yes, {_at(s.archived_at)}" if s.archived else "no"),
        ("created", _at(s.created_at)),
        ("updated", _at(s.updated_at)),
    ]
    if s.parent_id:
        rows.append(("parent", s.parent_id))
    if s.agent:
        rows.append(("agent", s.agent))
    for name, value in rows:
        console.print(Text.assemble((f"{name:9}", "bold"), f" {printable(str(value))}"))
    console.print(Text.assemble((f"{'activity':9}", "bold"), " " + ("none" if not items else "")))
    for item in items:
        console.print(f"  - {item_line(item)}", highlight=False)
    console.print(Text.assemble(("conversation", "bold"), "" if updates else " (empty)"))
    from api.cli.turns import Transcript

    transcript = Transcript(prompts=True)
    for update in updates:
        transcript.add(update)
    transcript.end()


def _at(iso_time: str | None) -> str:
    return f"{when(iso_time)} ({local_time(iso_time)})" if iso_time else ""


@sessions_app.command("new")
def sessions_new(
    cwd: str = typer.Argument(..., metavar="CWD", help="Absolute working directory."),
    parent: str | None = typer.Option(None, metavar="ID", help="Parent session id."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the session as JSON (as `sessions ls --json` lists it)."
    ),
    idempotency_key: str | None = KEY_OPTION,
    agent: str | None = typer.Option(
        None, metavar="NAME", help="The agent that runs its turns (`fleet agents` lists them)."
    ),
) -> None:
    """Create a session and print its id (with --json, the session). A CWD that does not
    exist here is kept (the session's tools run on a worker's host, where it may), with a
    note on stderr. A lost reply is retried with the same idempotency key: one session."""
    import os

    from api.context import store
    from orchestrator.agents.definitions import agent_for
    from orchestrator.session.sessions import create_session

    name = agent_for(store().settings, agent)
    created = keyed_write(
        lambda key: create_session(store(), cwd, parent, idempotency_key=key, agent=name),
        idempotency_key,
    )
    print(json.dumps(created.to_info(), indent=2) if as_json else created.session_id)
    if not os.path.isdir(cwd):
        err.print(
            f"note: {cwd} is not a directory on this machine; the session keeps it, as its "
            "tools run in it on a worker's host, where it must exist.",
            highlight=False,
        )


@app.command()
def activity(
    session_id: str,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a session's live work, per family."""
    from api.context import store
    from orchestrator.census.activity import census

    items = census(store(), session_id)
    if as_json:
        print(json.dumps([i.to_wire() for i in items], indent=2))
        return
    if not items:
        console.print("no live activity")
    for item in items:
        console.print(item_line(item), highlight=False)


@app.command()
def audit(
    session_id: str | None = typer.Argument(None, help="A session; omit for the whole fleet."),
    limit: int = count_option(50, low=1, high=1000, help="How many entries, newest first."),
    before: str | None = typer.Option(
        None,
        "--before",
        metavar="ENTRY_ID",
        help="Only entries older than this entry id: the last one of the page before.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (ISO 8601 UTC times)."),
) -> None:
    """Show the audit trail of a session (or of the fleet): every archive, unarchive, title
    change, delete and close, with when, who and the outcome. A full page ends with the
    command that shows the entries before it (on stderr)."""
    from api.context import store
    from orchestrator.session.sessions import get_session
    from orchestrator.storage.audit import read

    if session_id is not None:
        session_id = get_session(store(), session_id, include_deleted=True).session_id
    entries = read(store(), session_id, limit, before)
    if as_json:
        print(json.dumps(entries, indent=2))
        return
    if not entries:
        console.print("no audit entries" + (" before that one" if before else ""))
        return
    show(console, _audit_table(entries, whole_fleet=session_id is None, width=console.width))
    if len(entries) == limit:
        which = f" {session_id}" if session_id else ""
        err.print(
            f"older entries: fleet audit{which} --limit {limit} --before {entries[-1]['id']}",
            highlight=False,
        )


def _audit_table(entries: list[dict[str, Any]], *, whole_fleet: bool, width: int) -> Table:
    names = ["when", "action", "outcome", "actor", *(["sessionId"] if whole_fleet else [])]
    names.append("detail")
    rows = []
    for e in entries:
        detail = ", ".join(f"{k}={json.dumps(v)}" for k, v in e["detail"].items())
        row = [when(e["at"]), e["action"], e["outcome"], e["actor"]]
        rows.append([*row, *([e["sessionId"]] if whole_fleet else []), detail])
    ids = frozenset({4} if whole_fleet else ())
    return fitted(names, rows, width, {3: 5, len(names) - 1: 12}, ids=ids)
