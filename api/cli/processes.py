"""The fleet's long-running processes: ``fleet worker``, ``fleet up``, ``fleet api``,
``fleet beat``, ``fleet flower``, ``fleet acp`` and ``fleet demo``."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from api.cli.common import (
    LOOPBACK,
    FamilyName,
    app,
    console,
    err,
    interrupt,
    settings_with_redis,
    usage,
)
from api.cli.listen import api_bind_address, api_host, free_to_listen
from api.cli.params import (
    AUTO_ARCHIVE_INTERVAL_SECONDS,
    EVENT_HEARTBEAT_SECONDS,
    HEAD_TIMEOUT_SECONDS,
    WORKER_CONCURRENCY,
    count_option,
    seconds_option,
)


@app.command()
def worker(
    family: FamilyName = typer.Option(
        ..., metavar="FAMILY", help="The family it serves: turn, job, subagent or reminder."
    ),
    host: str = typer.Option(
        "", help="Host name reported for jobs (default: FLEET_HOSTNAME or the machine's name)."
    ),
    concurrency: int = count_option(
        WORKER_CONCURRENCY, low=0, help=f"Worker threads (0: {WORKER_CONCURRENCY})."
    ),
    loglevel: str = typer.Option("INFO", help="Celery log level."),
    control: bool = typer.Option(
        False,
        "--control",
        help="Take only the family's stops (its <family>.ctl queue), beside its full "
        "workers, so a stop is taken while all their threads are busy (turn, subagent, "
        "reminder).",
    ),
) -> None:
    """Run a Celery worker for one family (a real process; stop with Ctrl-C)."""
    from orchestrator.errors import InvalidParams
    from orchestrator.families import get as family_spec
    from orchestrator.logs import resolve_format
    from workers.app import create_app
    from workers.runtime import install

    spec = family_spec(family.value)
    settings = settings_with_redis()
    if host:
        settings = settings.model_copy(update={"hostname": host})
    host = settings.hostname
    try:
        queues = spec.worker_queues(host, control_only=control)
    except InvalidParams as exc:
        usage(f"--control: {exc.message}")
    celery_app = create_app(settings)
    install(settings, celery_app)
    if spec.host_stops:  # it owns what runs on its host: hold the name
        _hold_job_host()
    # JSON logs: no start-up banner among the JSON lines (workers/logs.py formats them).
    quiet = ["--quiet"] if resolve_format(settings.log_format, sys.stderr) == "json" else []
    celery_app.worker_main(
        [
            *quiet,
            "worker",
            "--family",
            family.value,
            *(["--control"] if control else []),
            "-n",
            spec.node_name(host, control_only=control),
            "-Q",
            ",".join(queues),
            "--pool",
            "threads",
            "-c",
            str(concurrency or WORKER_CONCURRENCY),
            "-l",
            loglevel,
            "-E",
            # Flower's worker-heartbeat events: every 10 s, not 2 (each is a PUBLISH of every
            # worker; Flower counts a worker gone after twice the interval it announces).
            "--heartbeat-interval",
            str(EVENT_HEARTBEAT_SECONDS),
            "--without-gossip",
            "--without-mingle",
        ]
    )


def _hold_job_host() -> None:
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
    hosts: int = count_option(1, low=1, help="How many job workers, each with its own host name."),
    api: bool = typer.Option(True, help="Serve the HTTP API too (the default; --no-api: not)."),
) -> None:
    """Run the whole fleet locally until Ctrl-C: Redis (embedded if FLEET_REDIS_URL is unset),
    one worker per family, a control-only worker for the turn, subagent and reminder stops
    (turn.ctl, subagent.ctl, reminder.ctl) and the API. While it runs,
    it publishes where it runs in FLEET_STATE_DIR/fleet.json, so other fleet commands started
    with the same state directory (the same working directory by default) find it without
    FLEET_REDIS_URL."""
    from localfleet import discovery
    from localfleet.embedded import resolve_redis_url
    from localfleet.fleet import LocalFleet
    from orchestrator.logs import configure as configure_logging
    from orchestrator.settings import FleetSettings

    settings = FleetSettings()
    configure_logging(settings.log_format or None)
    _refuse_a_second_up(settings.state_dir)
    if api:  # before anything starts: its API could not serve, and would be restarted
        bind = api_host(settings.api_host, settings.api_token)
        free_to_listen(bind, settings.api_port, "set FLEET_API_PORT to another (or --no-api)")
    try:
        url, embedded = resolve_redis_url(settings)
    except RuntimeError as exc:
        err.print(Text.assemble(("error", "red"), f": {exc}"))
        raise typer.Exit(2) from None
    fleet = LocalFleet(
        url, settings.key_prefix, settings.state_dir, hostname=settings.hostname, job_hosts=hosts
    )
    api_proc = None
    published = None
    try:
        fleet.start()
        fleet.wait_ready()
        _say_workers(fleet)
        api_url = f"http://{settings.api_host}:{settings.api_port}" if api else None
        if api_url:
            api_proc = fleet.start_api()
            console.print(f"API on {api_url} (log {fleet.api_log})")
        published = discovery.publish(
            settings.state_dir,
            url,
            settings.key_prefix,
            api_url,
            settings.agents_file,
            settings.agent,
        )
        console.print(
            f"published in {published}: fleet commands run with this state directory find "
            "this fleet without FLEET_REDIS_URL",
            highlight=False,
        )
        signal.signal(signal.SIGTERM, interrupt)
        while True:
            time.sleep(1)
            _restart_redis(embedded)
            api_proc = _restart_dead(fleet, api_proc)
    except KeyboardInterrupt:
        pass
    finally:
        if published is not None:
            discovery.unpublish(published)
        if api_proc is not None:
            api_proc.terminate()
            api_proc.wait(10)
        fleet.stop()
        if embedded is not None:
            embedded.stop()


def _refuse_a_second_up(state_dir: Path) -> None:
    """Exit 2 when a ``fleet up`` already runs with ``state_dir`` (``localfleet/discovery.py``)."""
    from localfleet import discovery

    running = discovery.find(state_dir)
    if running is not None:
        err.print(
            Text.assemble(
                ("error", "red"),
                f": `fleet up` already runs with the state directory {state_dir} "
                f"(pid {running.pid}, {running.redis_url}); stop it first or use another "
                "FLEET_STATE_DIR.",
            )
        )
        raise typer.Exit(2)


def _say_workers(fleet: Any) -> None:
    """Print where a started local fleet runs: its Redis, its workers, its job hosts."""
    console.print(
        Text.assemble(
            ("fleet up", "green"),
            f" on {fleet.redis_url} (prefix {fleet.key_prefix!r}); "
            f"{len(fleet.workers)} workers, logs in {fleet.state_dir / 'logs'}",
        )
    )
    console.print(f"workers: {', '.join(w.node for w in fleet.workers)}", highlight=False)
    console.print(f"job workers on {', '.join(fleet.job_host_names())}")


def _exit_status(code: int) -> str:
    """How a child ended, as people read it: ``status 1``, ``signal SIGKILL``."""
    if code >= 0:
        return f"status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


def _restart_redis(embedded: Any) -> None:
    """Start ``fleet up``'s embedded Redis again if it died (crash, OOM, kill -9), on its
    port and from its append-only file, saying so on stderr; a failed start is said and
    tried again on the next call. The workers and the API reconnect by themselves."""
    if embedded is None or embedded.running:
        return
    code = embedded.exited()  # None after a failed restart: tried again now
    how = "not running" if code is None else f"had exited ({_exit_status(code)})"
    try:
        embedded.restart()
    except RuntimeError as exc:
        err.print(Text(f"embedded Redis {how}; restart failed: {exc}", "red"))
        return
    err.print(
        Text(
            f"embedded Redis {how}; restarted on {embedded.url} "
            f"(pid {embedded.pid}, log {embedded.log_path})",
            "yellow",
        )
    )


def _restart_dead(fleet: Any, api_proc: Any) -> Any:
    """Replace every child of ``fleet up`` that exited, saying so on stderr; returns the API
    process (a new one if the old one had exited, ``None`` without an API).

    A worker that died (crash, OOM, kill -9) is replaced, so the fleet keeps serving every
    family; its jobs died with it and their leases lapse. A dead API is restarted on the
    same address, so the URL published in fleet.json answers again."""
    for dead, w in fleet.restart_dead():
        how = _exit_status(dead.process.returncode)
        err.print(
            Text(f"worker {w.node} had exited ({how}); restarted (log {w.log_path})", "yellow")
        )
    if api_proc is not None and api_proc.poll() is not None:
        old, code = api_proc.pid, api_proc.returncode
        api_proc = fleet.start_api()
        err.print(
            Text(
                f"API (pid {old}) had exited ({_exit_status(code)}); restarted as pid "
                f"{api_proc.pid} (log {fleet.api_log})",
                "yellow",
            )
        )
    return api_proc


@app.command("api")
def serve_api(
    host: str = typer.Option("", help="Bind address (default FLEET_API_HOST)."),
    port: int = count_option(0, low=0, high=65535, help="Port (default FLEET_API_PORT)."),
    head_timeout: float = seconds_option(
        HEAD_TIMEOUT_SECONDS,
        "--head-timeout",
        help="Seconds a client has to send a whole request head once it connects or its "
        "previous answer was sent; then the connection is closed (0: "
        f"{HEAD_TIMEOUT_SECONDS:g}).",
    ),
) -> None:
    """Serve the HTTP API (FastAPI on uvicorn)."""
    import uvicorn

    from api.http_server import head_timeout_protocol
    from orchestrator.logs import configure as configure_logging

    settings = settings_with_redis()
    configure_logging(settings.log_format or None)
    bind = api_bind_address(host or settings.api_host, settings.api_token)
    port = port or settings.api_port
    free_to_listen(bind, port, "choose another port with --port or FLEET_API_PORT")
    uvicorn.run(
        "api.rest:create_app",
        factory=True,
        host=bind,
        port=port,
        log_level="info",
        # A client that never finishes its request head is closed (slowloris).
        http=head_timeout_protocol(head_timeout or HEAD_TIMEOUT_SECONDS),
        # uvicorn's own loggers propagate to the root handler (FLEET_LOG_FORMAT) instead of
        # getting a format of their own.
        log_config=None,
    )


@app.command()
def beat(
    idle_seconds: float = seconds_option(
        0,
        help="Auto-archive sessions idle longer than this (0: the policy is off).",
    ),
    interval: float = seconds_option(
        AUTO_ARCHIVE_INTERVAL_SECONDS,
        help="Seconds between two runs of the auto-archive policy "
        f"(0: {AUTO_ARCHIVE_INTERVAL_SECONDS:g}).",
    ),
    schedule_file: str = typer.Option(
        "", help="Beat's schedule state file (default FLEET_STATE_DIR/celerybeat-schedule)."
    ),
    loglevel: str = typer.Option("INFO", help="Celery log level."),
) -> None:
    """Run Celery beat: schedules the archive reconciler (archive.reconcile every
    FLEET_RECONCILE_INTERVAL_SECONDS, unless 0) and, when it is on, the auto-archive policy
    (archive.auto), both on the maintenance queue (run by reminder workers). Run one beat
    per fleet."""
    from pathlib import Path

    from workers.app import create_app
    from workers.beat import beat_schedule

    settings = settings_with_redis()
    age = idle_seconds
    every = interval or AUTO_ARCHIVE_INTERVAL_SECONDS
    celery_app = create_app(settings)
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
        console.print("beat: auto-archive is off (no --idle-seconds)")
    if reconcile_every > 0:
        console.print(
            f"beat: archive.reconcile every {reconcile_every:g}s on the maintenance queue"
        )
    else:
        console.print("beat: the reconciler is off (FLEET_RECONCILE_INTERVAL_SECONDS=0)")
    celery_app.start(["beat", "-s", str(path), "-l", loglevel])


@app.command()
def flower(
    port: int = count_option(5555, low=1, high=65535, help="Port of Flower's web UI and HTTP API."),
    address: str = typer.Option("127.0.0.1", help="Bind address."),
) -> None:
    """Run Flower against the fleet's broker and key prefix. With FLEET_FLOWER_BASIC_AUTH
    (user:password) it asks for it; without, it binds to loopback only, where its UI and
    HTTP API answer without auth and read only (no revoke or shutdown: any page open in a
    browser on this machine could call them), with no CORS header (no other origin's page
    may read them) and only to loopback names (``api/flower_guard.py``)."""
    from api.context import redis_url, settings
    from workers.app import create_app

    redis_url()  # a fleet to watch, or FleetNotFound saying how to get one
    current = settings()
    auth = current.flower_basic_auth
    if not auth and address not in LOOPBACK:
        usage("set FLEET_FLOWER_BASIC_AUTH=user:password to serve Flower beyond loopback.")
    try:
        with socket.create_server((address, port)):
            pass
    except OSError as exc:
        usage(f"Flower cannot listen on {address} port {port}: {exc.strerror or exc}.")
    celery_app = create_app(current)
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if auth:
        argv.append(f"--basic-auth={auth}")
    else:
        from api.flower_guard import guard_unauthenticated

        # Flower reads this switch only from its environment, per request.
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
        argv.append("--read_only=True")
        guard_unauthenticated(address)  # no CORS answer to other origins, no rebound Host
    celery_app.start(argv)


@app.command()
def acp() -> None:
    """Speak ACP (JSON-RPC, one message per line) on stdin/stdout: an editor's agent command."""
    import logging

    from api.acp_stdio import main as acp_main
    from orchestrator.logs import configure as configure_logging
    from orchestrator.settings import get_settings

    configure_logging(get_settings().log_format or None, level=logging.WARNING)
    acp_main()


@app.command()
def demo() -> None:
    """Run a real fleet scenario end to end and print its timeline; exit 0 only if every
    expectation held."""
    from localfleet.demo import run_demo

    raise typer.Exit(run_demo(console))
