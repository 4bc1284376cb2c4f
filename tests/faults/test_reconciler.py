"""The archive reconciler against real workers: the archive flag is the desired state, the
census the actual one, and ``reconcile`` stops again whatever outlived its archive.

Most tests archive a session that owns an armed reminder on the shared ``fleet`` and then
break the stop path: the stop message is dropped, refused by the broker, or waits behind
paused consumers. A reminder is the item only its stop ends (a turn is ended by the archive's
own script; a job by its host's gate watch, which the last test shows making a lost job stop
harmless). The reconciler scans the run's whole archived index (other tests' sessions
included), so the assertions look only at the test's own session: its hash, its census, its
reminder, the stop messages sent for it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.archiving.reconcile import reconcile
from orchestrator.archiving.stops import dispatch_stops
from orchestrator.census.activity import census
from orchestrator.job import jobs
from orchestrator.reminder import reminders
from orchestrator.session.sessions import create_session, get_session, list_sessions
from orchestrator.storage import audit, metrics
from tests.helpers import FaultyDispatcher, wait_for
from tests.workers.support import (
    job_record,
    paused_consumer,
    reminder_state,
    wait_drained,
    wait_gone,
    wait_job_pid,
)

pytestmark = pytest.mark.timeout(90)

_BOOKKEEPING = ("reconcileTxn", "reconcileAttempts", "reconcileNextMs", "archiveHazard")


@pytest.fixture
def owned(store: Any, dispatcher: Any, fleet: Any) -> Iterator[list[str]]:
    """Sessions the test creates; at teardown their work is stopped (best effort)."""
    made: list[str] = []
    yield made
    for sid in made:
        result = archive(store, dispatcher, sid, stop_activity=True)
        if result.outcome == "already_archived":
            dispatch_stops(dispatcher, sid, census(store, sid))
    with contextlib.suppress(pytest.fail.Exception):
        wait_for(lambda: not any(census(store, s) for s in made), 15, message="drain")


def session_with_job(store: Any, dispatcher: Any, owned: list[str], seconds: float) -> Any:
    """A new session owning a running job; returns ``(sid, jid, pid, host)``."""
    sid = create_session(store, "/tmp/reconciler").session_id
    owned.append(sid)
    jid = jobs.create_job(store, dispatcher, sid, seconds, f"sleep {seconds}")
    pid = wait_job_pid(store, jid)
    return sid, jid, pid, job_record(store, jid)["host"]


def session_with_reminder(store: Any, owned: list[str]) -> tuple[str, str]:
    """A new session owning an armed reminder, due in 10 minutes; returns ``(sid, rid)``."""
    sid = create_session(store, "/tmp/reconciler").session_id
    owned.append(sid)
    return sid, reminders.create_reminder(store, sid, 600, "say later")


def lost_stop(dispatcher: Any) -> FaultyDispatcher:
    """A dispatcher that loses every reminder stop on its way to the workers."""
    return FaultyDispatcher(dispatcher, drop=frozenset({"reminder.stop"}))


def armed(store: Any, sid: str, rid: str) -> bool:
    """Whether ``rid`` is still armed and its session's census still lists it, alone."""
    return reminder_state(store, rid) == "armed" and [i.id for i in census(store, sid)] == [rid]


def reminder_nodes(fleet: Any) -> list[str]:
    """Node names of the shared fleet's workers consuming ``reminder.ctl`` (the reminder
    worker and its control-only one)."""
    return [w.node for w in fleet.workers if w.family.value == "reminder"]


@contextlib.contextmanager
def reminder_stops_paused(dispatcher: Any, fleet: Any) -> Iterator[None]:
    """No worker takes a reminder stop in the block (every consumer of ``reminder.ctl``
    paused); they are taken once it ends."""
    with contextlib.ExitStack() as paused:
        for node in reminder_nodes(fleet):
            paused.enter_context(paused_consumer(dispatcher.app, node, "reminder.ctl"))
        yield


def bookkeeping(store: Any, sid: str) -> dict[str, str]:
    fields = store.redis.hmget(store.keys.session(sid), *_BOOKKEEPING)
    return {k: v for k, v in zip(_BOOKKEEPING, fields, strict=True) if v is not None}


def hazards_counted(store: Any) -> int:
    return sum(metrics.snapshot(store).counters["fleet_archive_hazards"].values())


def test_a_lost_reminder_stop_is_sent_again_and_the_reminder_is_deleted(
    store: Any, dispatcher: Any, owned: list[str]
) -> None:
    # Given an archived session whose reminder stop was lost on its way to the worker
    sid, rid = session_with_reminder(store, owned)
    lossy = lost_stop(dispatcher)
    result = archive(store, lossy, sid, stop_activity=True)
    assert result.stop_report.sent == {"reminder": 1} and len(lossy.dropped) == 1
    assert armed(store, sid, rid)

    # When the reconciler runs past the grace period
    forward = FaultyDispatcher(dispatcher)
    report = reconcile(store, forward, grace_seconds=0, max_attempts=5)

    # Then it sent exactly the reminder stop again, for exactly that reminder, which is deleted
    assert [(t, a) for t, a, _ in forward.sent_for(sid)] == [("reminder.stop", [sid, [rid]])]
    assert report.restopped >= 1 and bookkeeping(store, sid)["reconcileAttempts"] == "1"
    wait_for(lambda: reminder_state(store, rid) == "deleted", 15, message="reminder deleted")
    wait_drained(store, sid)

    # And the next run finds it quiet: quietAt recorded, bookkeeping cleared, nothing sent
    again = FaultyDispatcher(dispatcher)
    reconcile(store, again, grace_seconds=0, max_attempts=5)
    assert again.sent_for(sid) == []
    assert bookkeeping(store, sid) == {}
    assert get_session(store, sid).to_info()["_meta"]["agentFleet"]["quietAt"]


def test_stops_no_worker_takes_raise_a_hazard_that_clears_once_the_work_drains(
    store: Any, dispatcher: Any, owned: list[str], fleet: Any
) -> None:
    # Given an archived session whose reminder stops no worker takes
    sid, rid = session_with_reminder(store, owned)
    hazards_before = hazards_counted(store)
    with reminder_stops_paused(dispatcher, fleet):
        archive(store, dispatcher, sid, stop_activity=True)

        # When the reconciler runs max_attempts times, and once more
        for _ in range(3):
            reconcile(store, dispatcher, grace_seconds=0, max_attempts=3, backoff_seconds=600)
        last = reconcile(store, dispatcher, grace_seconds=0, max_attempts=3, backoff_seconds=600)

        # Then the session carries an archive hazard in get and list, metrics and audit
        hazard = get_session(store, sid).to_info()["_meta"]["agentFleet"]["archiveHazard"]
        assert hazard["attempts"] == 3 and hazard["families"] == ["reminder"] and hazard["since"]
        listed = list_sessions(store, archived="only", cwd="/tmp/reconciler").sessions
        [mine] = [s for s in listed if s.session_id == sid]
        assert mine.to_info()["_meta"]["agentFleet"]["archiveHazard"] == hazard
        assert hazards_counted(store) >= hazards_before + 1
        entries = [e for e in audit.read(store, sid) if e["action"] == "reconcile"]
        assert [(e["outcome"], e["detail"]["families"]) for e in entries] == [
            ("hazard", ["reminder"])
        ]
        # And it is no longer retried every run: the fourth run backed off
        assert last.deferred >= 1 and bookkeeping(store, sid)["reconcileAttempts"] == "3"
        assert armed(store, sid, rid)

    # When the consumers are back and the queued stops delete the reminder
    wait_for(lambda: reminder_state(store, rid) == "deleted", 15, message="reminder deleted")
    wait_drained(store, sid)
    reconcile(store, dispatcher, grace_seconds=0, max_attempts=3, backoff_seconds=600)

    # Then the hazard is cleared (audited) and the archive recorded quiet
    info = get_session(store, sid).to_info()["_meta"]["agentFleet"]
    assert "archiveHazard" not in info and info["quietAt"]
    assert bookkeeping(store, sid) == {}
    outcomes = [e["outcome"] for e in audit.read(store, sid) if e["action"] == "reconcile"]
    assert outcomes == ["cleared", "hazard"]


def test_the_reconciler_leaves_sessions_within_the_grace_period_alone(
    store: Any, dispatcher: Any, owned: list[str]
) -> None:
    # Given an archived session whose reminder stop was lost a moment ago
    sid, rid = session_with_reminder(store, owned)
    archive(store, lost_stop(dispatcher), sid, stop_activity=True)

    # When the reconciler runs with a grace period not yet over
    forward = FaultyDispatcher(dispatcher)
    report = reconcile(store, forward, grace_seconds=60, max_attempts=5)

    # Then it sent nothing for it and wrote nothing on it
    assert report.in_grace >= 1
    assert forward.sent_for(sid) == [] and bookkeeping(store, sid) == {}
    assert armed(store, sid, rid)


def test_a_dry_run_reports_what_it_would_stop_and_writes_and_sends_nothing(
    store: Any, dispatcher: Any, owned: list[str]
) -> None:
    # Given an archived session whose reminder stop was lost
    sid, rid = session_with_reminder(store, owned)
    archive(store, lost_stop(dispatcher), sid, stop_activity=True)
    before = store.redis.hgetall(store.keys.session(sid))
    audit_before = store.redis.llen(store.keys.audit_log(sid))

    # When the reconciler runs dry
    forward = FaultyDispatcher(dispatcher)
    report = reconcile(store, forward, grace_seconds=0, max_attempts=1, dry_run=True)

    # Then it names the session and its live family, and nothing was sent or written
    assert report.dry_run and report.hazards == 0 and report.cleared == 0
    assert {"sessionId": sid, "outcome": "would_restop", "families": ["reminder"]} in (
        report.sessions
    )
    assert forward.sent == []
    assert store.redis.hgetall(store.keys.session(sid)) == before
    assert store.redis.llen(store.keys.audit_log(sid)) == audit_before
    assert armed(store, sid, rid)


def test_beat_schedules_the_reconciler_on_the_maintenance_queue_whatever_the_policy() -> None:
    from workers.beat import beat_schedule

    entry = beat_schedule(0, 300, 10)["archive-reconcile"]
    assert entry["task"] == "archive.reconcile" and entry["schedule"] == 10.0
    assert entry["args"] == (10.0,) and entry["options"]["queue"] == "maintenance"
    assert set(beat_schedule(3600, 300, 10)) == {"archive-auto", "archive-reconcile"}


def test_the_scheduled_task_on_a_reminder_worker_stops_what_a_lost_message_left_running(
    store: Any, dispatcher: Any, owned: list[str], fleet: Any
) -> None:
    # Given an archived session whose reminder stop was lost
    sid, rid = session_with_reminder(store, owned)
    archive(store, lost_stop(dispatcher), sid, stop_activity=True)

    # When beat's message reaches the maintenance queue (sent every second, as beat would on
    # a short interval; the worker applies its default 5 s grace period)
    def ticked() -> bool:
        dispatcher.send("archive.reconcile", [1.0], "maintenance")
        return reminder_state(store, rid) == "deleted"

    # Then a reminder worker runs the reconciler, which stops the reminder
    wait_for(ticked, 30, interval=1.0, message=f"archive.reconcile to stop reminder {rid}")
    wait_drained(store, sid)
    reminder = [w for w in fleet.workers if w.family.value == "reminder" and not w.control][0]
    assert "archive.reconcile" in reminder.log_path.read_text(errors="replace")


def test_a_rejected_stop_dispatch_keeps_the_archive_and_the_reconciler_stops_the_work(
    store: Any, dispatcher: Any, owned: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a session owning an armed reminder
    sid, rid = session_with_reminder(store, owned)

    # When it is archived while the broker refuses every message
    broker = FaultyDispatcher(dispatcher)
    broker.broken = True
    with caplog.at_level(logging.WARNING, logger="orchestrator.archiving.stops"):
        result = archive(store, broker, sid, stop_activity=True)

    # Then the archive stands, the failure is reported and logged, and the reminder stays armed
    assert result.outcome == "archived" and result.stop_report.failed
    assert result.stop_report.failed[0][0] == "reminder"
    assert any("stop dispatch for reminder failed" in r.getMessage() for r in caplog.records)
    assert get_session(store, sid).archived
    assert armed(store, sid, rid)

    # And a reconciler run while the broker is still down fails softly and counts an attempt
    down = reconcile(store, broker, grace_seconds=0, max_attempts=5)
    assert down.failed == {"reminder": 1} and bookkeeping(store, sid)["reconcileAttempts"] == "1"

    # When the broker is back, the next run stops the reminder
    broker.broken = False
    up = reconcile(store, broker, grace_seconds=0, max_attempts=5)
    assert up.sent == {"reminder": 1}
    assert [(t, a) for t, a, _ in broker.sent_for(sid)] == [("reminder.stop", [sid, [rid]])]
    wait_for(lambda: reminder_state(store, rid) == "deleted", 15, message="reminder deleted")
    wait_drained(store, sid)

    # And the run after that records it quiet and clears the bookkeeping
    reconcile(store, broker, grace_seconds=0, max_attempts=5)
    assert bookkeeping(store, sid) == {} and get_session(store, sid).quiet_at is not None


def test_a_lost_job_stop_leaves_the_reconciler_nothing_its_host_stopped_the_job(
    store: Any, dispatcher: Any, owned: list[str]
) -> None:
    # Given a session owning a job that runs on a real job worker
    sid = create_session(store, "/tmp/reconciler").session_id
    owned.append(sid)
    jid = jobs.create_job(store, dispatcher, sid, 71.3, "sleep 71.3")
    pid = wait_job_pid(store, jid)

    # When it is archived with stopActivity and the job stop is lost on its way
    lossy = FaultyDispatcher(dispatcher, drop=frozenset({"job.stop"}))
    result = archive(store, lossy, sid, stop_activity=True)
    assert result.stop_report.sent == {"job": 1} and len(lossy.dropped) == 1

    # Then the job's host stops it all the same (the archive's event, the gate), and the
    # reconciler finds nothing to send again
    wait_gone(pid)
    wait_drained(store, sid)
    assert job_record(store, jid)["state"] == "stopped"
    forward = FaultyDispatcher(dispatcher)
    reconcile(store, forward, grace_seconds=0, max_attempts=5)
    assert forward.sent_for(sid) == [] and bookkeeping(store, sid) == {}
