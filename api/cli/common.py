"""What every ``fleet`` command shares: the typer app, the consoles and the error printer."""

from __future__ import annotations

from enum import StrEnum
from typing import NoReturn

import typer
from rich.console import Console

from orchestrator.errors import FleetError, SessionActive
from orchestrator.families import names as family_names
from orchestrator.settings import FleetSettings, MissingRedisUrl

app = typer.Typer(
    help="agent-fleet: a control plane for agent sessions on Celery and Redis.",
    no_args_is_help=True,
    add_completion=False,
)
sessions_app = typer.Typer(help="List and create sessions.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
console = Console()
err = Console(stderr=True)


#: ``--family`` choices: the registered families (orchestrator/families).
FamilyName = StrEnum("FamilyName", {name: name for name in family_names()})  # type: ignore[misc]


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.callback()
def _every_command() -> None:
    # What a command changes is audited as done by "cli" (``fleet api`` and ``fleet acp``
    # name their own actors per request or connection).
    from orchestrator import audit

    audit.set_default_actor("cli")


def fail(exc: FleetError) -> NoReturn:
    """Print a refused request (code and message, the live items of a ``SessionActive``) and
    exit 2."""
    err.print(f"[red]error[/red] ({exc.code}): {exc.message}")
    if isinstance(exc, SessionActive):
        for item in exc.items:
            err.print(f"  - {item.family:9} {item.id}  {item.label}")
    raise typer.Exit(2)


def settings_with_redis() -> FleetSettings:
    """The settings of this command, read once from the environment, with a Redis URL: without
    one (or with one of another scheme) the command ends with what to do (``SystemExit``)."""
    settings = FleetSettings()
    try:
        settings.require_redis_url()
    except MissingRedisUrl as exc:
        raise SystemExit(str(exc)) from None
    return settings


LOOPBACK = ("127.0.0.1", "localhost", "::1")
