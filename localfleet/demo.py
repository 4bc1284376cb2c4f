"""``fleet demo``: a real fleet scenario, end to end, with a readable timeline.

Runs beside any fleet and leaves nothing behind: without ``FLEET_REDIS_URL`` it starts an
embedded Redis of its own under ``<state_dir>/demo`` (never the one ``fleet up`` keeps in
``<state_dir>/redis``) and removes it after; with ``FLEET_REDIS_URL`` it works under a fresh key
prefix (``<prefix>demo-<hex>:``) and deletes every key under it after. Then it starts one real
worker process per family and:

1. a parent session's turn spawns a subagent, starts a background job (a real process), stores
   a reminder and keeps thinking;
2. archive without stopping is refused, naming all four families;
3. archive with ``--stop`` returns at once;
4. the activity drains to zero (the job's pid is gone, the reminder is deleted and never fires,
   the subagent's turn is cancelled);
5. a step queued for the archived lineage is refused by the gate, with no model request;
6. unarchive restores nothing.

Exits 0 only if every expectation held.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import redis
from rich.console import Console
from rich.text import Text
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

from localfleet.embedded import resolve_redis_url
from localfleet.fleet import LocalFleet
from orchestrator.archiving import archive
from orchestrator.census import activity
from orchestrator.errors import SessionActive, SessionArchived
from orchestrator.families import Family
from orchestrator.items import ActivityItem
from orchestrator.session import sessions
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from workers.app import create_app
from workers.dispatch import CeleryDispatcher

PARENT_PROMPT = "\n".join(
    [
        "spawn think 30|say the subagent is done",
        "run 60",
        "remind 20 say the reminder fired",
        "think 60",
    ]
)


class Expectation(Exception):
    """An expectation of the scenario did not hold."""


class Timeline:
    """Prints timestamped lines relative to the start of the scenario."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()

    def say(self, text: str | Text) -> None:
        """A line after the time since the start; ``text`` is printed as it is (a ``Text``
        may style its parts), never read as Rich markup."""
        stamp = (f"{time.monotonic() - self.t0:7.3f}s", "dim")
        self.console.print(Text.assemble(stamp, "  ", text))

    def ok(self, text: str) -> None:
        self.say(Text.assemble(("✓", "green"), " ", text))

    def detail(self, text: str) -> None:
        self.console.print(Text(f"            {text}"))


def _until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``predicate()``'s first truthy value, polled every 50 ms; raises ``Expectation`` after
    ``timeout`` seconds."""

    def timed_out(_: RetryCallState) -> Any:
        raise Expectation(f"timed out after {timeout:g}s waiting for {what}")

    polls = Retrying(
        stop=stop_after_delay(timeout),
        wait=wait_fixed(0.05),
        retry=retry_if_result(lambda value: not value),
        retry_error_callback=timed_out,
    )
    return polls(predicate)


def _model_requests(store: Store, sid: str) -> int:
    return int(store.redis.llen(store.keys.model_requests(sid)))


def scenario(store: Store, dispatcher: Any, tl: Timeline) -> None:
    """The scenario itself; raises ``Expectation`` when something does not hold."""
    parent = sessions.create_session(store, str(Path.cwd()))
    sid = parent.session_id
    tl.say(Text.assemble("created session ", (sid, "bold")))
    tid = turns.start_turn(store, dispatcher, sid, PARENT_PROMPT)
    tl.say(f"prompted turn {tid}: spawn a subagent, run a job, set a reminder, keep thinking")
    items = _busy_in_four_families(store, sid, tl)
    job = next(i for i in items if i.family == Family.JOB)
    # The census counts a job from the moment it is stored; its pid exists once a worker runs it.
    job_pid = int(
        _until(
            lambda: store.redis.hget(store.keys.job(job.id), "pid"),
            15,
            "the job's process to start",
        )
    )
    child = next(i for i in items if i.family == Family.SUBAGENT).id
    reminder = next(i for i in items if i.family == Family.REMINDER).id
    child_turns = store.redis.zrange(store.keys.live_turns(child), 0, -1)

    _archive_is_refused(store, dispatcher, sid, tl)
    started = time.monotonic()
    result = archive.archive(store, dispatcher, sid, stop_activity=True)
    took_ms = (time.monotonic() - started) * 1000
    if result.outcome != "archived":
        raise Expectation(f"archive --stop answered {result.outcome}")
    tl.ok(
        f"archive --stop returned in {took_ms:.1f} ms; stops sent: "
        + json.dumps(result.stop_report.sent)
    )
    requests_at_archive = {s: _model_requests(store, s) for s in (sid, child)}
    drained_at = _until(
        lambda: not activity.census(store, sid) and time.monotonic(), 15, "the activity to drain"
    )
    tl.ok(f"activity drained to zero {drained_at - started:.2f} s after the archive")
    _everything_stopped(store, tl, job_pid, reminder, child, [*child_turns], tid)
    _gate_refuses_a_late_wake_up(store, dispatcher, child, tl)
    _unarchive_restores_nothing(store, sid, tl, requests_at_archive)


def _busy_in_four_families(store: Store, sid: str, tl: Timeline) -> list[ActivityItem]:
    """Wait for live work in all four families; print and return it."""

    def four_families() -> list[ActivityItem] | None:
        items = activity.census(store, sid)
        return items if {i.family for i in items} == set(Family) else None

    items: list[ActivityItem] = _until(four_families, 30, "live work in all four families")
    tl.ok("live work in all four families:")
    for item in items:
        tl.detail(f"{item.family:9} {item.label}")
    return items


def _archive_is_refused(store: Store, dispatcher: Any, sid: str, tl: Timeline) -> None:
    """A plain archive is refused, naming every family."""
    try:
        archive.archive(store, dispatcher, sid)
        raise Expectation("archive without --stop was not refused")
    except SessionActive as refused:
        families = sorted({str(i.family) for i in refused.items})
        if families != sorted(Family):
            raise Expectation(f"refusal named {families}, not all four families") from None
        tl.ok(
            f"archive refused (session_active); it names {len(refused.items)} live items: "
            + ", ".join(families)
        )


def _everything_stopped(
    store: Store,
    tl: Timeline,
    job_pid: int,
    reminder: str,
    child: str,
    child_turns: list[str],
    tid: str,
) -> None:
    """The job's process is gone, the reminder deleted, every turn cancelled."""
    if psutil.pid_exists(job_pid) and psutil.Process(job_pid).status() != psutil.STATUS_ZOMBIE:
        raise Expectation(f"job process {job_pid} is still running")
    tl.ok(f"job process {job_pid} is gone")
    rem_state = store.redis.hget(store.keys.reminder(reminder), "state")
    if rem_state != "deleted":
        raise Expectation(f"reminder {reminder} is {rem_state}, not deleted")
    tl.ok(f"reminder {reminder} deleted")
    for ctid in child_turns:
        turn = turns.get_turn(store, ctid)
        if turn is None or turn.state.value != "cancelled":
            raise Expectation(f"subagent turn {ctid} is {turn and turn.state.value}")
    tl.ok(f"subagent {child}: turn cancelled")
    parent_turn = turns.get_turn(store, tid)
    if parent_turn is None or parent_turn.state.value != "cancelled":
        raise Expectation(f"parent turn is {parent_turn and parent_turn.state.value}")
    tl.ok("parent turn cancelled")


def _gate_refuses_a_late_wake_up(store: Store, dispatcher: Any, child: str, tl: Timeline) -> None:
    try:
        late = turns.start_turn(store, dispatcher, child, "say I woke up late", source="reminder")
    except SessionArchived:
        tl.ok("the gate refused a late wake-up of the archived subagent: nothing stored or said")
    else:
        raise Expectation(f"a late wake-up of the archived subagent was stored (turn {late})")


def _unarchive_restores_nothing(
    store: Store, sid: str, tl: Timeline, requests_at_archive: dict[str, int]
) -> None:
    restored = archive.unarchive(store, sid)
    tl.say(f"unarchived {sid} ({restored} sessions restored)")
    time.sleep(1.5)  # let any wrongly restarted work show itself
    if activity.census(store, sid):
        raise Expectation("unarchive restarted work")
    after = {s: _model_requests(store, s) for s in requests_at_archive}
    if after != requests_at_archive:
        raise Expectation(f"model requests after the archive: {requests_at_archive} -> {after}")
    tl.ok("unarchive restored nothing: no live work, no model request since the archive")
    listed = [s.session_id for s in sessions.list_sessions(store).sessions]
    if sid not in listed:
        raise Expectation("the unarchived session is not in the default list")
    tl.ok("the session is back in the default list")


def _clean(url: str, prefix: str, embedded: Any, state_dir: Path, passed: bool) -> None:
    """Leave nothing behind: delete the demo's keys (its own prefix on a shared Redis), or
    its embedded server's data; its state directory too when it passed (the worker logs of
    a failed run are kept for reading), and the fleet's if that is empty now."""
    if embedded is None:
        client = redis.Redis.from_url(url)
        try:
            for batch in _batched(client.scan_iter(match=f"{prefix}*", count=1000)):
                client.unlink(*batch)
        finally:
            client.close()
    else:
        shutil.rmtree(embedded.data_dir, ignore_errors=True)
    if passed:
        shutil.rmtree(state_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # the fleet's state directory, if the demo made it
            state_dir.parent.rmdir()


def _batched(keys: Any, size: int = 500) -> Any:
    batch: list[Any] = []
    for key in keys:
        batch.append(key)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def run_demo(console: Console) -> int:
    """Run the scenario; return the process exit code (0 only if every expectation held)."""
    configured = FleetSettings()
    # The demo's own state directory, so its embedded Redis is never the one `fleet up` uses.
    settings = configured.model_copy(update={"state_dir": configured.state_dir / "demo"})
    try:
        url, embedded = resolve_redis_url(settings)
    except RuntimeError as exc:
        console.print(Text.assemble(("demo cannot start", "red"), f": {exc}"))
        return 2
    # On a shared Redis, a fresh prefix keeps the demo's keys apart from real sessions.
    prefix = settings.key_prefix
    if embedded is None:
        prefix = f"{settings.key_prefix}demo-{uuid.uuid4().hex[:8]}:"
    # The workers get the URL and the prefix on their command line's environment.
    settings = settings.model_copy(update={"redis_url": url, "key_prefix": prefix})
    tl = Timeline(console)
    where = f"embedded Redis at {url}" if embedded else f"{url} (prefix {prefix!r})"
    tl.say(f"Redis: {where}")
    fleet = LocalFleet(url, prefix, settings.state_dir, hostname=settings.hostname)
    store = Store(url, prefix, settings=settings)
    passed = False
    try:
        fleet.start()
        fleet.wait_ready(90)
        tl.say(f"workers ready: {', '.join(w.node for w in fleet.workers)}")
        scenario(store, CeleryDispatcher(create_app(settings)), tl)
        passed = True
    except (Expectation, RuntimeError) as exc:
        tl.say(Text(f"✗ {exc}", "red"))
        console.print(
            Text.assemble(("demo failed", "red"), f"; worker logs in {fleet.state_dir / 'logs'}")
        )
        return 1
    finally:
        fleet.stop()
        store.close()
        if embedded is not None:
            embedded.stop()
        _clean(url, prefix, embedded, settings.state_dir, passed)
    console.print(Text.assemble(("demo passed", "green"), ": every expectation held."))
    return 0
