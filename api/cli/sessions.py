"""``fleet sessions ls|new``, ``fleet prompt``, ``fleet activity`` and ``fleet audit``: reading and
starting work in sessions."""

from __future__ import annotations

import json

import typer
from rich.table import Column, Table

from api.cli.common import app, console, fail, sessions_app
from orchestrator.errors import FleetError


@sessions_app.command("ls")
def sessions_ls(
    all_: bool = typer.Option(False, "--all", help="Archived and not archived."),
    archived: bool = typer.Option(False, "--archived", help="Only archived sessions."),
    cwd: str | None = typer.Option(None, help="Only sessions in this directory (absolute)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List sessions, newest activity first."""
    from api.context import store
    from orchestrator.sessions import list_sessions

    flt = "include" if all_ else "only" if archived else "exclude"
    try:
        sessions, cursor = [], None
        while True:
            page = list_sessions(store(), archived=flt, cwd=cwd, cursor=cursor, limit=200)
            sessions.extend(page.sessions)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps([s.to_info() for s in sessions], indent=2))
        return
    table = Table(
        Column("sessionId", no_wrap=True, min_width=29),
        "cwd",
        "title",
        Column("updatedAt", no_wrap=True),
        "archived",
        Column("parent", no_wrap=True, min_width=29),
    )
    for s in sessions:
        table.add_row(
            s.session_id,
            s.cwd,
            s.title,
            s.updated_at,
            "yes" if s.archived else "",
            s.parent_id or "",
        )
    console.print(table)


@sessions_app.command("new")
def sessions_new(
    cwd: str = typer.Argument(..., help="Absolute working directory."),
    parent: str | None = typer.Option(None, help="Parent session id."),
) -> None:
    """Create a session and print its id."""
    from api.context import store
    from orchestrator.sessions import create_session

    try:
        print(create_session(store(), cwd, parent).session_id)
    except FleetError as exc:
        fail(exc)


@app.command()
def prompt(
    session_id: str,
    text: str = typer.Argument(..., help="Prompt; '\\n' separates scripted instructions."),
) -> None:
    """Start a turn in a session and print its turn id."""
    from api.context import dispatcher, store
    from orchestrator.turns import start_turn

    try:
        print(start_turn(store(), dispatcher(), session_id, text.replace("\\n", "\n")))
    except FleetError as exc:
        fail(exc)


@app.command()
def activity(session_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show a session's live work, per family."""
    from api.context import store
    from orchestrator.activity import census

    try:
        items = census(store(), session_id)
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps([i.to_wire() for i in items], indent=2))
        return
    if not items:
        console.print("no live activity")
    for item in items:
        console.print(f"{item.family:9} {item.id}  {item.label}")


@app.command()
def audit(
    session_id: str | None = typer.Argument(None, help="A session; omit for the whole fleet."),
    limit: int = typer.Option(50, min=1, max=1000, help="How many entries, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the audit trail of a session (or of the fleet): every archive, unarchive, title
    change, delete and close, with when, who and the outcome."""
    from api.context import store
    from orchestrator.audit import read
    from orchestrator.sessions import get_session

    try:
        if session_id is not None:
            session_id = get_session(store(), session_id, include_deleted=True).session_id
        entries = read(store(), session_id, limit)
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(entries, indent=2))
        return
    if not entries:
        console.print("no audit entries")
        return
    table = Table(
        Column("at", no_wrap=True),
        Column("action", no_wrap=True, min_width=12),
        Column("outcome", no_wrap=True, min_width=16),
        Column("actor", no_wrap=True),
        *([] if session_id else [Column("sessionId", no_wrap=True, min_width=29)]),
        "detail",
    )
    for e in entries:
        detail = ", ".join(f"{k}={json.dumps(v)}" for k, v in e["detail"].items())
        row = [e["at"], e["action"], e["outcome"], e["actor"]]
        table.add_row(*row, *([] if session_id else [e["sessionId"]]), detail)
    console.print(table)
