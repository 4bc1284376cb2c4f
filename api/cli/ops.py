"""``fleet reconcile`` and ``fleet sweep``: run a maintenance pass once, by hand."""

from __future__ import annotations

import json

import typer

from api.cli.common import app, console, fail
from api.cli.params import seconds_option
from orchestrator.errors import FleetError


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
    from orchestrator.archiving.reconcile import hazard_backoff_seconds
    from orchestrator.archiving.reconcile import reconcile as run_reconcile
    from orchestrator.settings import get_settings

    settings = get_settings()
    try:
        report = run_reconcile(
            store(),
            dispatcher(),
            grace_seconds=settings.reconcile_grace_seconds,
            backoff_seconds=hazard_backoff_seconds(settings.reconcile_interval_seconds),
            dry_run=dry_run,
            include_quiet=include_quiet,
        )
    except FleetError as exc:
        fail(exc)
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
    stuck_seconds: float = seconds_option(
        0,
        help="Seconds without progress before a turn is examined (default "
        "FLEET_TURN_STUCK_SECONDS).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the turn sweeper once (turn workers run it six times per FLEET_TURN_STUCK_SECONDS):
    a running turn whose step is lost is resumed (or ended failed once it was lost 4
    times), a cancelling one whose step is gone ends cancelled; one whose
    step's message still waits in the broker is left waiting."""
    from api.context import dispatcher, store
    from orchestrator.turn.sweeper import sweep as run_sweep

    try:
        report = run_sweep(store(), dispatcher(), stuck_seconds=stuck_seconds or None)
    except FleetError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(report.to_wire()))
        return
    totals = ", ".join(f"{action} {n}" for action, n in report.totals.items())
    console.print(f"sweep: {report.examined} examined, {totals}, waiting {len(report.waiting)}")
    for action, tids in report.turns.items():
        for tid in tids:
            console.print(f"  {tid}: {action}")
    for tid in report.waiting:
        console.print(f"  {tid}: waiting (its step's message is in the broker)")
