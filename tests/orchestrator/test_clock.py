"""Decisions use the store's clock (Redis ``TIME``), never the deciding process's: a process
whose clock is an hour ahead or behind decides exactly as one whose clock is right.

The skew is this process's ``time.time`` moved by an hour (monkeypatched); Redis runs on the
same machine with the true time. The real-worker form is ``tests/faults/test_clock_skew.py``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from orchestrator.archiving import bulk
from orchestrator.archiving.archive import archive
from orchestrator.archiving.reconcile import reconcile
from orchestrator.families import Task
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage import audit
from orchestrator.storage.store import Store, iso
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import unique_cwd

HOUR = 3600.0
SKEWS = [HOUR, -HOUR]

_real_time = time.time


def skew_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move this process's wall clock by ``seconds`` (0 puts it back)."""
    monkeypatch.setattr(time, "time", lambda: _real_time() + seconds)


def reminder_stops(recorder: RecordingDispatcher, sid: str) -> list[Any]:
    return [m for m in recorder.sent if m[0] == Task.REMINDER_STOP and m[1][0] == sid]


@pytest.mark.parametrize(
    ("archive_skew", "reconcile_skew"),
    [(HOUR, 0.0), (-HOUR, 0.0), (0.0, HOUR), (0.0, -HOUR)],
    ids=["api-ahead", "api-behind", "reconciler-ahead", "reconciler-behind"],
)
def test_the_reconcile_grace_ends_on_the_stores_clock_whatever_the_process_clocks_say(
    store: Store, monkeypatch: pytest.MonkeyPatch, archive_skew: float, reconcile_skew: float
) -> None:
    # Given a session with an armed reminder, archived (stopActivity) by a process whose clock
    # is skewed, and whose reminder stop is lost (recorded, never delivered)
    sid = sessions.create_session(store, unique_cwd()).session_id
    reminders.create_reminder(store, sid, 3600, "later")
    recorder = RecordingDispatcher()
    skew_clock(monkeypatch, archive_skew)
    archive(store, recorder, sid, stop_activity=True)
    assert len(reminder_stops(recorder, sid)) == 1

    # When the reconciler runs at once from a process with a (possibly other) skewed clock
    skew_clock(monkeypatch, reconcile_skew)
    first = reconcile(store, recorder, grace_seconds=30)

    # Then the archive is still within its grace: nothing is sent again
    assert sid not in [s["sessionId"] for s in first.sessions]
    assert len(reminder_stops(recorder, sid)) == 1

    # When the reconciler runs with a 1 s grace until that grace has ended
    wait_for(
        lambda: (
            sid in [s["sessionId"] for s in reconcile(store, recorder, grace_seconds=1).sessions]
        ),
        15,
        message="the reconcile grace to end",
    )

    # Then the lost reminder stop was sent again
    assert len(reminder_stops(recorder, sid)) == 2


@pytest.mark.parametrize("skew", SKEWS, ids=["ahead", "behind"])
def test_the_idle_filter_measures_idle_age_on_the_stores_clock(
    store: Store, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    # Given, in one working directory, a session just active and one idle for 45 minutes
    cwd = unique_cwd()
    fresh = sessions.create_session(store, cwd).session_id
    idle = sessions.create_session(store, cwd).session_id
    backdate(store, idle, store.now_ms() - 45 * 60_000)

    # When the auto-archive filter (idle longer than 30 minutes) runs from a skewed process
    skew_clock(monkeypatch, skew)
    found, _ = bulk.auto_candidates(store, idle_seconds=30 * 60, cwd=cwd)

    # Then it selects exactly what it selects unskewed: the idle session only
    assert found == [idle]
    assert fresh not in found


@pytest.mark.parametrize("skew", SKEWS, ids=["ahead", "behind"])
def test_times_a_skewed_process_stores_are_the_stores_clock(
    store: Store, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    # Given a process whose clock is an hour off
    skew_clock(monkeypatch, skew)
    # When it creates a session
    before = store.now_ms()
    created = sessions.create_session(store, unique_cwd()).session_id
    after = store.now_ms()
    # Then the session's activity time is on the store's clock
    updated = int(store.redis.hget(store.keys.session(created), "updatedMs"))
    assert before <= updated <= after


def backdate(store: Store, sid: str, ms: int) -> None:
    """Move a session's last activity to ``ms`` (hash and every listing index)."""
    k = store.keys
    cwd_hash = store.redis.hget(k.session(sid), "cwdHash")
    store.redis.hset(k.session(sid), mapping={"updatedMs": ms, "updatedAt": iso(ms)})
    for state in ("all", "active", "archived"):
        for key in (k.index(state), k.index(state, cwd_hash)):
            store.redis.zadd(key, {sid: ms}, xx=True)


@pytest.mark.parametrize("skew", SKEWS, ids=["ahead", "behind"])
def test_a_bulk_archive_stamps_its_sessions_with_the_stores_clock_at_its_write(
    store: Store, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    # Given idle sessions, and a caller whose clock is an hour off
    cwd = unique_cwd()
    ids = [sessions.create_session(store, cwd).session_id for _ in range(3)]
    skew_clock(monkeypatch, skew)
    before = store.now_ms()
    # When a bulk archive takes them
    bulk.bulk_archive(store, RecordingDispatcher(), flt=bulk.BulkFilter(cwd=cwd))
    after = store.now_ms()
    # Then each is stamped by the store's clock during the write, its audit entry too
    for sid in ids:
        stamped = sessions.get_session(store, sid).archived_at
        assert iso(before) <= stamped <= iso(after)
        [entry] = [e for e in audit.read(store, sid) if e["action"] == "bulk_archive"]
        assert entry["at"] == stamped
