"""``fleet agents``: the agents of ``FLEET_AGENTS_FILE``, and ``fleet agents check NAME``,
which starts one and runs ``initialize``, saying what is missing."""

from __future__ import annotations

import json
import os
import shutil

import typer

from api.cli.common import FleetTyper, app, console, err, fail
from orchestrator.agents.definitions import Catalog, load
from orchestrator.errors import FleetError
from orchestrator.settings import FleetSettings

agents_app = FleetTyper(help="List the fleet's agents and check that one starts.")
app.add_typer(agents_app, name="agents")


def _catalog() -> tuple[FleetSettings, Catalog]:

    from api.context import settings as fleet_settings

    settings = fleet_settings()
    try:
        return settings, load(settings.agents_file)
    except FleetError as exc:
        fail(exc)


@agents_app.callback(invoke_without_command=True)
def agents_ls(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the agents sessions may name (FLEET_AGENTS_FILE) and the default (FLEET_AGENT)."""
    if ctx.invoked_subcommand is not None:
        return
    settings, catalog = _catalog()
    rows = [
        {
            "name": d.name,
            "preset": d.preset.value,
            "permissions": d.permissions.value,
            "upstream": d.upstream,
        }
        for d in (catalog.get(n) for n in catalog.names())
    ]
    if as_json:
        print(json.dumps({"agents": rows, "default": settings.agent}, indent=2))
        return
    if not rows:
        console.print(
            "No agents: FLEET_AGENTS_FILE is not set here, and no `fleet up` running with the "
            f"state directory {settings.state_dir} names one. Set FLEET_AGENTS_FILE to a TOML "
            "file of [agents.NAME] tables, or FLEET_STATE_DIR to your fleet's state directory."
        )
        return
    for row in rows:
        mark = " (default)" if row["name"] == settings.agent else ""
        console.print(
            f"{row['name']}{mark}  {row['preset']}  permissions={row['permissions']}  "
            f"{row['upstream'] or '-'}"
        )


@agents_app.command("check")
def agents_check(name: str = typer.Argument(..., metavar="NAME")) -> None:
    """Start agent NAME on this host, run ACP initialize and stop it; exit 1 naming what is
    missing (its binary, bwrap, an answer)."""
    from orchestrator.agents.runner import check

    settings, catalog = _catalog()
    try:
        defn = catalog.get(name)
    except FleetError as exc:
        fail(exc)
    # Where the fleet would put its homes (FLEET_STATE_DIR), so a home it would refuse shows.
    home = settings.state_dir / "agents" / f".check-{name}-{os.getpid()}"
    try:
        found = check(defn, home, dict(os.environ))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if found.problems:
        for problem in found.problems:
            err.print(f"{name}: {problem}", highlight=False)
        raise typer.Exit(1)
    loads = "loads its sessions" if found.load_session else "cannot load its sessions"
    console.print(f"{name}: ok ({found.agent_info or 'agent'}, {loads}, {found.seconds:.2f} s)")


permissions_app = FleetTyper(
    help="Permission requests of agents waiting for a person.", no_args_is_help=True
)
app.add_typer(permissions_app, name="permissions")


@permissions_app.command("ls")
def permissions_ls(
    session_id: str = typer.Argument(..., metavar="SESSION"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the permission requests waiting in SESSION, oldest first."""
    from api.context import store
    from orchestrator.agents import permissions
    from orchestrator.session.sessions import get_session

    try:
        get_session(store(), session_id)
        waiting = permissions.pending(store(), session_id)
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps({"permissions": [p.to_wire() for p in waiting]}, indent=2))
        return
    if not waiting:
        console.print("No permission request is waiting.")
    for p in waiting:
        title = p.tool_call.get("title") or p.tool_call.get("toolCallId", "")
        options = ", ".join(f"{o.get('optionId')} ({o.get('kind')})" for o in p.options)
        console.print(f"{p.request_id}  turn {p.turn_id}  {title}  options: {options}")


@permissions_app.command("answer")
def permissions_answer(
    session_id: str = typer.Argument(..., metavar="SESSION"),
    request_id: str = typer.Argument(..., metavar="REQUEST"),
    outcome: str = typer.Argument(
        ..., metavar="OUTCOME", help="allow, reject, cancelled, or one of the request's options."
    ),
) -> None:
    """Answer a waiting permission request (the first answer wins)."""
    from api.context import store
    from orchestrator.agents import permissions
    from orchestrator.session.sessions import get_session

    try:
        get_session(store(), session_id)
        chosen = permissions.answer(store(), session_id, request_id, outcome)
    except FleetError as exc:
        fail(exc)
    console.print(f"{request_id}: answered {chosen}")
