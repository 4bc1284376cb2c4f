"""The auto-archive policy: idle sessions without live work are archived on a schedule;
sessions unarchived by hand wait until they are idle again (``unarchivedAt``). The policy
itself runs here with the ``recorder``; the last tests run it through Celery: the task on a
real reminder worker (``fleet`` fixture) and ``fleet beat`` scheduling it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from orchestrator.archiving import archive, bulk
from orchestrator.archiving import scripts as archiving_scripts
from orchestrator.errors import InvalidParams, StoreUnavailable
from orchestrator.families import MAINTENANCE_QUEUE, Family, Task
from orchestrator.reminder import reminders
from orchestrator.session import scripts as session_scripts
from orchestrator.session import sessions
from orchestrator.storage import audit
from orchestrator.storage.store import Store, iso, now_ms
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import chain
from tests.orchestrator.test_bulk import backdate, new, outcomes, read

HOUR_MS = 3_600_000


def idle(store: Store, cwd: str, count: int = 1, hours: float = 10) -> list[str]:
    """Sessions whose last activity was ``hours`` ago."""
    ids = [new(store, cwd) for _ in range(count)]
    for sid in ids:
        backdate(store, sid, now_ms() - int(hours * HOUR_MS))
    return ids


# --------------------------------------------------------------------------- unarchivedAt


@pytest.mark.parametrize(
    "when",
    [
        "1999-12-31T23:59:59.999Z",
        "2000-02-29T12:00:00.000Z",
        "2024-02-29T00:00:00.001Z",
        "2026-03-01T08:09:10.011Z",
        "2100-03-01T00:00:00.000Z",
    ],
)
def test_unarchive_records_when_each_restored_session_was_unarchived(
    store: Store, recorder: RecordingDispatcher, cwd: str, when: str
) -> None:
    root, child = (s.session_id for s in chain(store, 1, cwd))
    archive.archive(store, recorder, root)
    ms = bulk.parse_instant(when, "when")
    recorder_json = audit.script_recorder(store, "unarchive", {})
    restored = archiving_scripts.unarchive(
        store, session_id=root, recorder=recorder_json, now_ms=ms, now_iso=iso(ms)
    )
    assert isinstance(restored, archiving_scripts.Unarchived)
    for sid in (root, child):
        h = store.redis.hgetall(store.keys.session(sid))
        assert h["unarchivedAt"] == when == iso(ms)
        assert int(h["unarchivedMs"]) == ms


def test_the_unarchive_script_takes_both_times_or_reads_the_servers_clock(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session
    root, _ = (s.session_id for s in chain(store, 1, cwd))
    archive.archive(store, recorder, root)
    recorder_json = audit.script_recorder(store, "unarchive", {})
    # When the script is given one time of the two, it refuses
    for ms, when in ((None, iso(now_ms())), (now_ms(), "")):
        with pytest.raises(StoreUnavailable, match="both given or both empty"):
            archiving_scripts.unarchive(
                store, session_id=root, recorder=recorder_json, now_ms=ms, now_iso=when
            )
    assert store.redis.hget(store.keys.session(root), "archived") == "1"
    # And archive.unarchive leaves both empty: the script reads Redis's own clock
    before = store.now_ms()
    assert archive.unarchive(store, root) == 2
    h = store.redis.hgetall(store.keys.session(root))
    assert before <= int(h["unarchivedMs"]) <= store.now_ms()
    assert h["unarchivedAt"] == iso(int(h["unarchivedMs"]))


def test_unarchive_without_a_time_uses_the_server_clock(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = new(store, cwd)
    archive.archive(store, recorder, sid)
    before = now_ms()
    archive.unarchive(store, sid)
    h = store.redis.hgetall(store.keys.session(sid))
    assert abs(int(h["unarchivedMs"]) - before) < 5_000
    assert bulk.parse_instant(h["unarchivedAt"], "x") == int(h["unarchivedMs"])
    # Unarchive still leaves updatedAt alone
    assert h["updatedAt"] == read(store, sid).updated_at


# --------------------------------------------------------------------------- the policy


def test_idle_sessions_without_live_work_are_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    old = idle(store, cwd, 3)
    fresh = new(store, cwd)
    busy = idle(store, cwd)[0]
    rid = reminders.create_reminder(store, busy, 60, "later")
    backdate(store, busy, now_ms() - 10 * HOUR_MS)

    result = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd)

    assert outcomes(result) == {**{sid: "archived" for sid in old}, busy: "refused"}
    assert all(read(store, sid).archived for sid in old)
    assert not read(store, fresh).archived and not read(store, busy).archived
    # Nothing is stopped: the busy session's reminder is still armed, no stop was sent
    assert store.redis.hget(store.keys.reminder(rid), "state") == "armed"
    assert recorder.sent == []
    # A real run does not read the census of busy sessions (it only leaves them alone)
    assert result.results[-1].activity is None


def test_a_session_unarchived_by_hand_waits_until_it_is_idle_again(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session idle for ten hours, archived, then unarchived by an operator now
    (sid,) = idle(store, cwd)
    archive.archive(store, recorder, sid)
    archive.unarchive(store, sid)
    # Then a run now leaves it alone (its idle clock restarted at the unarchive)
    assert outcomes(bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd)) == {}
    assert not read(store, sid).archived
    # And a run an hour and a bit later archives it
    later = now_ms() + HOUR_MS + 60_000
    result = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd, now=later)
    assert outcomes(result) == {sid: "archived"}


def test_the_idle_clock_is_checked_again_where_the_archive_is_written(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session selected as idle, then unarchived by hand before its batch is written
    (sid,) = idle(store, cwd)
    candidates = bulk.auto_candidates(store, idle_seconds=3600, cwd=cwd)
    assert candidates[0] == [sid]
    archive.archive(store, recorder, sid)
    archive.unarchive(store, sid)
    monkeypatch.setattr(bulk, "auto_candidates", lambda *a, **k: candidates)
    # Then the run skips it
    result = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd)
    assert outcomes(result) == {sid: "skipped"}
    assert not read(store, sid).archived


def test_a_dry_run_reports_what_would_be_archived_and_writes_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    old = idle(store, cwd, 2)
    busy = idle(store, cwd)[0]
    turns.start_turn(store, recorder, busy, "think 5")
    backdate(store, busy, now_ms() - 10 * HOUR_MS)
    before = {sid: store.redis.hgetall(store.keys.session(sid)) for sid in [*old, busy]}

    result = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd, dry_run=True)

    assert outcomes(result) == {old[0]: "archived", old[1]: "archived", busy: "refused"}
    assert [a.family for a in result.results[-1].activity or []] == [Family.TURN]
    assert {sid: store.redis.hgetall(store.keys.session(sid)) for sid in before} == before


def test_a_run_takes_the_oldest_first_up_to_its_limit(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    ids = [new(store, cwd) for _ in range(4)]
    for hours, sid in zip((10, 40, 20, 30), ids, strict=True):
        backdate(store, sid, now_ms() - hours * HOUR_MS)
    first = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd, limit=2)
    assert [i.session_id for i in first.results] == [ids[1], ids[3]]
    second = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd, limit=2)
    assert [i.session_id for i in second.results] == [ids[2], ids[0]]


def test_an_idle_subtree_is_archived_in_its_roots_transition(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child = (s.session_id for s in chain(store, 1, cwd))
    backdate(store, child, now_ms() - 20 * HOUR_MS)
    backdate(store, root, now_ms() - 10 * HOUR_MS)
    result = bulk.auto_archive(store, recorder, idle_seconds=3600, cwd=cwd)
    assert outcomes(result) == {root: "archived", child: "already_archived"}
    assert archive.unarchive(store, root) == 2


def test_the_policy_is_off_at_zero(store: Store, recorder: RecordingDispatcher) -> None:
    with pytest.raises(InvalidParams) as caught:
        bulk.auto_archive(store, recorder, idle_seconds=0)
    assert "--idle-seconds" in caught.value.message
    # Without an age it is off too
    with pytest.raises(InvalidParams):
        bulk.auto_archive(store, recorder, cwd="/tmp/fleet-auto-off")


# --------------------------------------------------------------------------- scheduling


def test_beat_schedules_archive_auto_on_the_maintenance_queue() -> None:
    from workers.beat import beat_schedule

    entry = beat_schedule(3600, 300)["archive-auto"]
    assert entry["task"] == Task.ARCHIVE_AUTO == "archive.auto"
    assert entry["schedule"] == 300.0
    assert entry["args"] == (3600.0,)
    assert entry["options"]["queue"] == MAINTENANCE_QUEUE == "maintenance"
    assert beat_schedule(0, 300) == {}


def test_reminder_workers_consume_the_maintenance_queue_and_run_archive_auto() -> None:
    from orchestrator.settings import FleetSettings
    from workers.app import create_app, static_queues, worker_queues

    app = create_app(FleetSettings())

    assert worker_queues(Family.REMINDER, "h")[-1] == "maintenance"
    assert "maintenance" not in worker_queues(Family.TURN, "h")
    assert "maintenance" in {q.name for q in static_queues()}
    app.loader.import_default_modules()
    assert "archive.auto" in app.tasks


def test_fleet_archive_auto_dry_run_prints_what_would_be_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.cli import app

    monkeypatch.setenv("COLUMNS", "300")
    old = idle(store, cwd, 2)
    fresh = new(store, cwd)
    session_scripts.set_title(store, session_id=old[0], title="an old idea", source="client")
    result = CliRunner().invoke(
        app, ["archive", "--auto", "--dry-run", "--cwd", cwd, "--idle-seconds", "3600"]
    )
    assert result.exit_code == 0, result.output
    assert "would archive 2 idle session(s)" in result.stdout
    assert old[0] in result.stdout and old[1] in result.stdout and "an old idea" in result.stdout
    assert fresh not in result.stdout
    assert not any(read(store, sid).archived for sid in old)
    # Off without an age
    off = CliRunner().invoke(app, ["archive", "--auto", "--dry-run", "--cwd", cwd])
    assert off.exit_code == 2 and "--idle-seconds" in off.output
    # And for real, with --json
    done = CliRunner().invoke(
        app, ["archive", "--auto", "--cwd", cwd, "--idle-seconds", "3600", "--json"]
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["totals"]["archived"] == 2
    assert all(read(store, sid).archived for sid in old)


@pytest.mark.integration
def test_archive_auto_runs_on_a_reminder_worker(store: Store, dispatcher: Any, fleet: Any) -> None:
    cwd = f"/tmp/fleet-auto-test/{uuid.uuid4().hex}"
    old = idle(store, cwd, 3)
    fresh = new(store, cwd)
    dispatcher.send(Task.ARCHIVE_AUTO, [3600, cwd], MAINTENANCE_QUEUE)
    wait_for(
        lambda: all(read(store, sid).archived for sid in old),
        30,
        message="the reminder worker to run archive.auto",
    )
    assert not read(store, fresh).archived


@pytest.mark.integration
def test_fleet_beat_sends_archive_auto_to_the_maintenance_queue(
    redis_url: str, tmp_path: Path
) -> None:
    # A prefix of its own: no worker consumes it, so the scheduled messages wait in the queue
    prefix = f"fleet-test-beat-{uuid.uuid4().hex[:8]}:"
    env = dict(
        os.environ,
        FLEET_REDIS_URL=redis_url,
        FLEET_KEY_PREFIX=prefix,
        FLEET_STATE_DIR=str(tmp_path),
    )
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    queue = f"{prefix}celery:{MAINTENANCE_QUEUE}"
    log = (tmp_path / "beat.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "beat", "--idle-seconds", "7200", "--interval", "0.5"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: client.llen(queue) >= 2 or proc.poll() is not None,
            30,
            message="beat to schedule archive.auto twice",
        )
        assert proc.poll() is None, (tmp_path / "beat.log").read_text()
        message = json.loads(client.lindex(queue, 0))
        assert message["headers"]["task"] == "archive.auto"
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert args == [7200.0] and kwargs == {}
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()
    # Off: beat schedules only the archive reconciler
    from workers.beat import beat_schedule

    assert set(beat_schedule(0, 300, 10)) == {"archive-reconcile"}


def test_sessions_listing_is_unaffected_by_the_policys_fields(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = new(store, cwd)
    archive.archive(store, recorder, sid)
    archive.unarchive(store, sid)
    info = read(store, sid).to_info()
    assert info["archived"] is False
    assert sessions.list_sessions(store, cwd=cwd).sessions[0].session_id == sid
