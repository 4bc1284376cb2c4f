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
from orchestrator.families import get as family_spec
from orchestrator.families import names as family_names

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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.callback()
def _every_command() -> None:
    # What a command changes is audited as done by "cli" (``fleet api`` and ``fleet acp``
    # name their own actors per request or connection).
    from orchestrator import audit

    audit.set_default_actor("cli")


def _fail(exc: FleetError) -> None:
    err.print(f"[red]error[/red] ({exc.code}): {exc.message}")
    if isinstance(exc, SessionActive):
        for item in exc.items:
            err.print(f"  - {item.family:9} {item.id}  {item.label}")
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
    from orchestrator.logs import resolve_format
    from orchestrator.settings import get_settings

    url = redis_url()
    settings = get_settings()
    host = host or os.environ.get("FLEET_HOSTNAME") or settings.hostname
    os.environ["FLEET_WORKER_FAMILY"] = family.value
    os.environ["FLEET_HOSTNAME"] = host
    from workers.app import app as celery_app
    from workers.app import worker_queues

    celery_app.conf.broker_url = url
    if family_spec(family.value).host_stops:  # it owns what runs on its host: hold the name
        _hold_job_host(host)
    queues = worker_queues(family.value, host)
    # JSON logs: no start-up banner among the JSON lines (workers/logs.py formats them).
    quiet = ["--quiet"] if resolve_format(settings.log_format, sys.stderr) == "json" else []
    celery_app.worker_main(
        [
            *quiet,
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


def _hold_job_host(host: str) -> None:
    """A job worker takes its host name before consuming: with another live job worker on the
    same name (stops are routed by name), it exits 1 naming that worker."""
    from orchestrator.errors import HostHeld
    from workers.runtime import hold_job_host

    try:
        hold_job_host()
    except HostHeld as exc:
        typer.echo(f"fleet worker: {exc.message}", err=True)
        raise typer.Exit(1) from None


@app.command()
def up(
    hosts: int = typer.Option(1, min=1, help="How many job workers, each with its own host name."),
    api: bool = typer.Option(True, help="Also serve the HTTP API."),
) -> None:
    """Run the whole fleet locally until Ctrl-C: Redis (embedded if FLEET_REDIS_URL is unset),
    one worker per family, and the API."""
    from api.embedded import resolve_redis_url
    from api.local import LocalFleet
    from orchestrator.logs import configure as configure_logging
    from orchestrator.processes import die_with_parent
    from orchestrator.settings import get_settings

    configure_logging()
    settings = get_settings()
    try:
        url, embedded = resolve_redis_url(settings)
    except RuntimeError as exc:
        err.print(f"[red]error[/red]: {exc}")
        raise typer.Exit(2) from None
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
        console.print(f"job workers on {', '.join(fleet.job_host_names())}")
        if api:
            import subprocess

            env = dict(os.environ, FLEET_REDIS_URL=url)
            api_proc = subprocess.Popen(
                [sys.executable, "-m", "api.cli", "api"],
                env=env,
                preexec_fn=die_with_parent(signal.SIGTERM, new_session=False),
            )
            console.print(f"API on http://{settings.api_host}:{settings.api_port}")
        signal.signal(signal.SIGTERM, _interrupt)
        while True:
            time.sleep(1)
            # A worker that died (crash, OOM, kill -9) is replaced, so the fleet keeps
            # serving every family; its jobs died with it and their leases lapse.
            for w in fleet.restart_dead():
                err.print(
                    f"[yellow]worker {w.family}@{w.host} had exited; restarted "
                    f"(log {w.log_path})[/yellow]"
                )
    except KeyboardInterrupt:
        pass
    finally:
        if api_proc is not None:
            api_proc.terminate()
            api_proc.wait(10)
        fleet.stop()
        if embedded is not None:
            embedded.stop()


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def api_bind_address(requested: str, token: str) -> str:
    """The address the API may bind: any with a token configured; loopback only without one
    (said on stderr, since anyone who can reach the port could archive sessions)."""
    if token or requested in LOOPBACK:
        return requested
    err.print(
        f"[yellow]FLEET_API_TOKEN is not set: binding to 127.0.0.1 instead of {requested}. "
        "Set a token to serve the API beyond this machine.[/yellow]"
    )
    return "127.0.0.1"


@app.command("api")
def serve_api(
    host: str = typer.Option("", help="Bind address (default FLEET_API_HOST)."),
    port: int = typer.Option(0, help="Port (default FLEET_API_PORT)."),
) -> None:
    """Serve the HTTP API (FastAPI on uvicorn)."""
    import uvicorn

    from api.context import redis_url
    from orchestrator.logs import configure as configure_logging
    from orchestrator.settings import get_settings

    redis_url()
    settings = get_settings()
    configure_logging()
    bind = api_bind_address(host or settings.api_host, settings.api_token)
    uvicorn.run(
        "api.rest:create_app",
        factory=True,
        host=bind,
        port=port or settings.api_port,
        log_level="info",
        # uvicorn's own loggers propagate to the root handler (FLEET_LOG_FORMAT) instead of
        # getting a format of their own.
        log_config=None,
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
        console.print(f"{item.family:9} {item.id}  {item.label}")


@app.command()
def archive(
    ids: list[str] | None = typer.Argument(
        None, help="Session id (several with --bulk).", show_default=False
    ),
    stop: bool = typer.Option(False, "--stop", help="Stop live work, then archive."),
    confirmed: list[str] | None = typer.Option(
        None,
        "--confirmed",
        help="With --stop: an item confirmed for stopping, FAMILY:ID (repeat it); anything "
        "else live refuses the archive (activity_changed) and nothing is written.",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (for scripts)."),
    bulk: bool = typer.Option(False, "--bulk", help="Archive many: ids, --ids-file or a filter."),
    ids_file: str | None = typer.Option(
        None, "--ids-file", help="--bulk: a file of session ids, one a line ('-': stdin)."
    ),
    cwd: str | None = typer.Option(None, "--cwd", help="--bulk/--auto filter: this directory."),
    idle_since: str | None = typer.Option(
        None, "--idle-since", help="--bulk filter: last activity before this ISO 8601 time."
    ),
    q: str | None = typer.Option(None, "--q", help="--bulk filter: title contains this text."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would happen; write nothing."),
    auto: bool = typer.Option(
        False, "--auto", help="Run the auto-archive policy once (idle sessions, no live work)."
    ),
    idle_seconds: float = typer.Option(
        0, "--idle-seconds", help="--auto: idle age (default FLEET_AUTO_ARCHIVE_IDLE_SECONDS)."
    ),
) -> None:
    """Archive a session. Refused while it has live work unless --stop is given. With --stop
    on a terminal, the live items are listed and the archive stops exactly what was confirmed:
    if other work started meanwhile, nothing is written and the new list is printed.

    --bulk archives many sessions in batches (ids, --ids-file, or a filter of --cwd,
    --idle-since, --q) with a progress bar; --auto runs the auto-archive policy once. Both
    take --dry-run and --json. Exit status: 0 done, 1 some sessions refused or not found,
    2 the request was refused.
    """
    if bulk or auto:
        from api.cli_bulk import run_auto, run_bulk

        if auto:
            run_auto(
                ids=ids or [],
                bulk=bulk,
                ids_file=ids_file,
                cwd=cwd,
                idle_since=idle_since,
                q=q,
                stop=stop,
                dry_run=dry_run,
                as_json=as_json,
                idle_seconds=idle_seconds,
            )
            return
        run_bulk(
            ids=ids or [],
            ids_file=ids_file,
            cwd=cwd,
            idle_since=idle_since,
            q=q,
            stop=stop,
            dry_run=dry_run,
            as_json=as_json,
        )
        return
    extra = [
        name
        for name, given in (
            ("--ids-file", ids_file is not None),
            ("--cwd", cwd is not None),
            ("--idle-since", idle_since is not None),
            ("--q", q is not None),
            ("--dry-run", dry_run),
            ("--idle-seconds", bool(idle_seconds)),
            ("--confirmed", bool(confirmed) and (bulk or auto)),
        )
        if given
    ]
    if extra or len(ids or []) != 1:
        err.print(
            "[red]error[/red]: give one session id"
            + (f" ({', '.join(extra)} needs --bulk or --auto)" if extra else "")
            + "; several sessions or a filter need --bulk."
        )
        raise typer.Exit(2)
    session_id = (ids or [""])[0]
    from api.context import dispatcher, store
    from orchestrator.archive import archive as do_archive

    try:
        binding = _confirmation(session_id, stop, confirmed, as_json)
        result = do_archive(
            store(), dispatcher(), session_id, stop_activity=stop, confirmed=binding
        )
    except FleetError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(result.to_wire(), indent=2))
        return
    console.print(
        f"{session_id}: {result.outcome.replace('_', ' ')}"
        + (f", stop sent for {len(result.stopped)} item(s)" if result.stopped else "")
    )


def _confirmation(
    session_id: str, stop: bool, given: list[str] | None, as_json: bool
) -> list[tuple[str, str]] | None:
    """What ``fleet archive --stop`` is bound to: the ``--confirmed FAMILY:ID`` items, or on
    a terminal (without ``--json``) the live items shown and confirmed here; None (stop
    everything live) for a script that names none. Raises ``InvalidParams`` for a malformed
    item or --confirmed without --stop; exits 1 when the user declines."""
    from api.context import dispatcher, store
    from orchestrator.activity import census
    from orchestrator.errors import InvalidParams

    if given:
        pairs = [tuple(item.partition(":")[::2]) for item in given]
        if not stop or any(not family or not item_id for family, item_id in pairs):
            raise InvalidParams(
                "--confirmed takes FAMILY:ID items and needs --stop.", {"param": "confirmed"}
            )
        return [(family, item_id) for family, item_id in pairs]
    if not stop or as_json or not sys.stdin.isatty():
        return None
    items = census(store(), session_id, dispatcher())
    if items:
        console.print(f"{session_id} has live work:")
        for item in items:
            console.print(f"  - {item.family:9} {item.id}  {item.label}")
        if not typer.confirm(f"Stop these {len(items)} item(s) and archive?", default=False):
            raise typer.Exit(1)
    return [(item.family, item.id) for item in items]


@app.command()
def beat(
    idle_seconds: float = typer.Option(
        0, help="Auto-archive idle age (default FLEET_AUTO_ARCHIVE_IDLE_SECONDS; 0: off)."
    ),
    interval: float = typer.Option(
        0, help="Seconds between runs (default FLEET_AUTO_ARCHIVE_INTERVAL_SECONDS)."
    ),
    schedule_file: str = typer.Option(
        "", help="Beat's schedule state file (default FLEET_STATE_DIR/celerybeat-schedule)."
    ),
    loglevel: str = typer.Option("INFO", help="Celery log level."),
) -> None:
    """Run Celery beat: schedules the archive reconciler (archive.reconcile every
    FLEET_RECONCILE_INTERVAL_SECONDS) and, when it is on, the auto-archive policy
    (archive.auto), both on the maintenance queue (run by reminder workers). Run one beat
    per fleet."""
    from pathlib import Path

    from api.context import redis_url
    from orchestrator.settings import get_settings
    from workers.beat import beat_schedule

    url = redis_url()
    settings = get_settings()
    age = idle_seconds or settings.auto_archive_idle_seconds
    every = interval or settings.auto_archive_interval_seconds
    if every <= 0:
        err.print("[red]error[/red]: the auto-archive interval must be positive.")
        raise typer.Exit(2)
    from workers.app import app as celery_app

    celery_app.conf.broker_url = url
    reconcile_every = settings.reconcile_interval_seconds
    celery_app.conf.beat_schedule = beat_schedule(age, every, reconcile_every)
    path = Path(schedule_file) if schedule_file else settings.state_dir / "celerybeat-schedule"
    path.parent.mkdir(parents=True, exist_ok=True)
    if age > 0:
        console.print(
            f"beat: archive.auto every {every:g}s (sessions idle > {age:g}s) on the "
            "maintenance queue"
        )
    else:
        console.print("beat: auto-archive is off (FLEET_AUTO_ARCHIVE_IDLE_SECONDS=0)")
    console.print(f"beat: archive.reconcile every {reconcile_every:g}s on the maintenance queue")
    celery_app.start(["beat", "-s", str(path), "-l", loglevel])


@app.command()
def reconcile(
    dry_run: bool = typer.Option(False, "--dry-run", help="Report only; write and send nothing."),
    include_quiet: bool = typer.Option(
        False, "--all", help="Also re-examine archives already recorded quiet."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the archive reconciler once: stop again the work that outlived its archive, flag
    archive hazards, clear them once the work is gone (FLEET_RECONCILE_* settings)."""
    from api.context import dispatcher, store
    from orchestrator.reconcile import reconcile as run_reconcile
    from orchestrator.settings import get_settings

    settings = get_settings()
    try:
        report = run_reconcile(
            store(),
            dispatcher(),
            grace_seconds=settings.reconcile_grace_seconds,
            max_attempts=settings.reconcile_max_attempts,
            backoff_seconds=10 * settings.reconcile_interval_seconds,
            dry_run=dry_run,
            include_quiet=include_quiet,
        )
    except FleetError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(report.to_wire()))
        return
    verb = "would stop again" if dry_run else "stopped again"
    console.print(
        f"reconcile{' (dry run)' if dry_run else ''}: {report.scanned} archived, "
        f"{report.examined} examined, {report.quiet} quiet, {verb} {report.restopped}, "
        f"{report.hazards} new hazard(s), {report.cleared} cleared"
    )
    for entry in report.sessions:
        fams = ", ".join(entry.get("families", []))
        console.print(
            f"  {entry['sessionId']}: {entry['outcome']}" + (f" ({fams})" if fams else "")
        )


@app.command()
def sweep(
    stuck_seconds: float = typer.Option(
        0,
        help="Seconds without progress before a turn is examined (default "
        "FLEET_TURN_STUCK_SECONDS).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the turn sweeper once (turn workers run it every FLEET_TURN_SWEEP_INTERVAL_SECONDS):
    a running turn whose step is lost is resumed (or ended failed after
    FLEET_TURN_MAX_RESUMES), a cancelling one whose step is gone ends cancelled."""
    from api.context import dispatcher, store
    from orchestrator.sweeper import sweep as run_sweep

    try:
        report = run_sweep(store(), dispatcher(), stuck_seconds=stuck_seconds or None)
    except FleetError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(report.to_wire()))
        return
    totals = ", ".join(f"{action} {n}" for action, n in report.totals.items())
    console.print(f"sweep: {report.examined} examined, {totals}")
    for action, tids in report.turns.items():
        for tid in tids:
            console.print(f"  {tid}: {action}")


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
        _fail(exc)
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
    if not auth and address not in LOOPBACK:
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
    from orchestrator.logs import configure as configure_logging

    configure_logging(level=logging.WARNING)
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
