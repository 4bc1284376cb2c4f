"""The ``fleet`` command line (typer).

``fleet up`` and ``fleet demo`` start an embedded Redis when ``FLEET_REDIS_URL`` is unset;
every other command needs ``FLEET_REDIS_URL``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.table import Column, Table

from orchestrator.errors import FleetError, SessionActive

app = typer.Typer(
    help="agent-fleet: a control plane for agent sessions on Celery and Redis.",
    no_args_is_help=True,
    add_completion=False,
)
sessions_app = typer.Typer(help="List and create sessions.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
console = Console()
err = Console(stderr=True)


class FamilyName(StrEnum):
    turn = "turn"
    job = "job"
    subagent = "subagent"
    reminder = "reminder"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fail(exc: FleetError) -> None:
    err.print(f"[red]error[/red] ({exc.code}): {exc.message}")
    if isinstance(exc, SessionActive):
        for item in exc.items:
            err.print(f"  - {item.family.value:9} {item.id}  {item.label}")
    raise typer.Exit(2)


@app.command()
def worker(
    family: FamilyName = typer.Option(..., help="Which family this worker serves."),
    host: str = typer.Option(
        "", help="Host name reported for jobs (default: FLEET_HOSTNAME or the machine's name)."
    ),
    concurrency: int = typer.Option(0, help="Worker threads (default FLEET_WORKER_CONCURRENCY)."),
    loglevel: str = typer.Option("INFO", help="Celery log level."),
) -> None:
    """Run a Celery worker for one family (a real process; stop with Ctrl-C)."""
    from api.context import redis_url
    from orchestrator.families import Family
    from orchestrator.settings import get_settings

    url = redis_url()
    settings = get_settings()
    host = host or os.environ.get("FLEET_HOSTNAME") or settings.hostname
    os.environ["FLEET_WORKER_FAMILY"] = family.value
    os.environ["FLEET_HOSTNAME"] = host
    from workers.app import app as celery_app
    from workers.app import worker_queues

    celery_app.conf.broker_url = url
    queues = worker_queues(Family(family.value), host)
    celery_app.worker_main(
        [
            "worker",
            "-n",
            f"{family.value}@{host}",
            "-Q",
            ",".join(queues),
            "--pool",
            "threads",
            "-c",
            str(concurrency or settings.worker_concurrency),
            "-l",
            loglevel,
            "-E",
            "--without-gossip",
            "--without-mingle",
        ]
    )


@app.command()
def up(
    hosts: int = typer.Option(1, help="How many job workers, each with its own host name."),
    api: bool = typer.Option(True, help="Also serve the HTTP API."),
) -> None:
    """Run the whole fleet locally until Ctrl-C: Redis (embedded if FLEET_REDIS_URL is unset),
    one worker per family, and the API."""
    from api.embedded import resolve_redis_url
    from api.local import LocalFleet
    from orchestrator.settings import get_settings

    settings = get_settings()
    url, embedded = resolve_redis_url(settings)
    fleet = LocalFleet(
        url, settings.key_prefix, settings.state_dir, hostname=settings.hostname, job_hosts=hosts
    )
    api_proc = None
    try:
        fleet.start()
        fleet.wait_ready()
        console.print(
            f"[green]fleet up[/green] on {url} (prefix {settings.key_prefix!r}); "
            f"{len(fleet.workers)} workers, logs in {settings.state_dir / 'logs'}"
        )
        if api:
            import subprocess

            env = dict(os.environ, FLEET_REDIS_URL=url)
            api_proc = subprocess.Popen([sys.executable, "-m", "api.cli", "api"], env=env)
            console.print(f"API on http://{settings.api_host}:{settings.api_port}")
        signal.signal(signal.SIGTERM, _interrupt)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if api_proc is not None:
            api_proc.terminate()
            api_proc.wait(10)
        fleet.stop()
        if embedded is not None:
            embedded.stop()


@app.command("api")
def serve_api(
    host: str = typer.Option("", help="Bind address (default FLEET_API_HOST)."),
    port: int = typer.Option(0, help="Port (default FLEET_API_PORT)."),
) -> None:
    """Serve the HTTP API (FastAPI on uvicorn)."""
    import uvicorn

    from api.context import redis_url
    from orchestrator.settings import get_settings

    redis_url()
    settings = get_settings()
    uvicorn.run(
        "api.rest:create_app",
        factory=True,
        host=host or settings.api_host,
        port=port or settings.api_port,
        log_level="info",
    )


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
        _fail(exc)
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
        _fail(exc)


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
        _fail(exc)


@app.command()
def activity(session_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show a session's live work, per family."""
    from api.context import store
    from orchestrator.activity import census

    try:
        items = census(store(), session_id)
    except FleetError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps([i.to_wire() for i in items], indent=2))
        return
    if not items:
        console.print("no live activity")
    for item in items:
        console.print(f"{item.family.value:9} {item.id}  {item.label}")


@app.command()
def archive(
    session_id: str,
    stop: bool = typer.Option(False, "--stop", help="Stop live work, then archive."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Archive a session. Refused while it has live work unless --stop is given."""
    from api.context import dispatcher, store
    from orchestrator.archive import archive as do_archive

    try:
        result = do_archive(store(), dispatcher(), session_id, stop_activity=stop)
    except FleetError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(result.to_wire(), indent=2))
        return
    console.print(
        f"{session_id}: {result.outcome.replace('_', ' ')}"
        + (f", stop sent for {len(result.stopped)} item(s)" if result.stopped else "")
    )


@app.command()
def unarchive(session_id: str) -> None:
    """Unarchive a session (restores nothing that was stopped)."""
    from api.context import store
    from orchestrator.archive import unarchive as do_unarchive

    try:
        n = do_unarchive(store(), session_id)
    except FleetError as exc:
        _fail(exc)
    console.print(f"{session_id}: " + ("unarchived" if n else "was not archived"))


@app.command()
def flower(
    port: int = typer.Option(5555, help="Port of Flower's web UI and HTTP API."),
    address: str = typer.Option("127.0.0.1", help="Bind address."),
) -> None:
    """Run Flower against the configured broker (basic auth from FLEET_FLOWER_BASIC_AUTH,
    ``user:password``; required unless bound to loopback)."""
    from api.context import redis_url
    from orchestrator.settings import get_settings

    url = redis_url()
    auth = get_settings().flower_basic_auth
    if not auth and address not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            "[red]error[/red]: set FLEET_FLOWER_BASIC_AUTH=user:password to serve Flower "
            "beyond loopback."
        )
        raise typer.Exit(2)
    from workers.app import app as celery_app

    celery_app.conf.broker_url = url
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if auth:
        argv.append(f"--basic-auth={auth}")
    celery_app.start(argv)


@app.command()
def acp() -> None:
    """Speak ACP (JSON-RPC, one message per line) on stdin/stdout: an editor's agent command."""
    import logging

    from api.acp_stdio import main as acp_main

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    acp_main()


@app.command()
def demo() -> None:
    """Run a real fleet scenario end to end and print its timeline; exit 0 only if every
    expectation held."""
    from api.demo import run_demo

    raise typer.Exit(run_demo(console))


def main() -> Any:
    """Console-script entry point."""
    return app()


if __name__ == "__main__":
    sys.exit(main())
