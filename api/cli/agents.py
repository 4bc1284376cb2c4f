"""``fleet agents``: the agents of ``FLEET_AGENTS_FILE``, and ``fleet agents check NAME``,
which starts one and runs ``initialize``, saying what is missing."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import typer

from api.cli.common import FleetTyper, app, console, err, fail
from orchestrator.agents.definitions import Catalog, load
from orchestrator.errors import FleetError
from orchestrator.settings import FleetSettings

agents_app = FleetTyper(help="List the fleet's agents and check that one starts.")
app.add_typer(agents_app, name="agents")


def _catalog() -> tuple[FleetSettings, Catalog]:

    settings = FleetSettings()
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
        console.print("No agents: set FLEET_AGENTS_FILE to a TOML file of [agents.NAME] tables.")
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

    _, catalog = _catalog()
    try:
        defn = catalog.get(name)
    except FleetError as exc:
        fail(exc)
    with tempfile.TemporaryDirectory(prefix="fleet-agent-check-") as home:
        found = check(defn, Path(home), dict(os.environ))
    if found.problems:
        for problem in found.problems:
            err.print(f"{name}: {problem}", highlight=False)
        raise typer.Exit(1)
    loads = "loads its sessions" if found.load_session else "cannot load its sessions"
    console.print(f"{name}: ok ({found.agent_info or 'agent'}, {loads}, {found.seconds:.2f} s)")
