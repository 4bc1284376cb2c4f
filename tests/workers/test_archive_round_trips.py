"""One archive with ``stopActivity`` costs three round trips to Redis, whatever it stops.

The session is busy in all four families (a running turn, a claimed job, an armed reminder, a
subagent with a running turn of its own). Its archive is one script (the durable write, its
audit entry and count, its events and the census it reads right after the write, with the
``WAITAOF`` in the same pipeline), one pipelined publish of the stops, and one pipeline counting
and recording what was sent. Every write redis-py makes to a socket is counted, as in
``test_dispatch_batch``; a regression that adds a round trip shows here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.archiving import archive
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.job import scripts as job_scripts
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage import audit
from orchestrator.storage.store import Store, iso, now_ms
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, count_round_trips

pytestmark = pytest.mark.redis

#: The script with its WAITAOF, the batch of stop messages, the metrics and audit pipeline.
ROUND_TRIPS = 3


def _busy(store: Store, cwd: str) -> str:
    """A session with live work in every family, stored (no worker needed)."""
    null = RecordingDispatcher()
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, null, sid, "think 600")
    jid = jobs.create_job(store, null, sid, 600, "sleep 600s")
    job_scripts.job_claim(
        store,
        job_id=jid,
        host="rt-host",
        lease_ms=600_000,
        now_iso=iso(now_ms()),
        instance="rt-host/w",
        max_per_host=10,
        limit_template="limit %d",
    )
    reminders.create_reminder(store, sid, 3600, "say later")
    child = sessions.create_session(store, cwd, parent_id=sid).session_id
    turns.start_turn(store, null, child, "think 600", source="subagent")
    return sid


def test_an_archive_with_stop_is_three_round_trips(
    store: Store, dispatcher: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = str(tmp_path)
    # Given a warm process (scripts loaded, broker connected and its queues declared)
    archive.archive(store, dispatcher, _busy(store, cwd), stop_activity=True)
    sid = _busy(store, cwd)
    before = store.redis.xlen(store.keys.event_stream)

    # When a session busy in all four families is archived with stopActivity
    writes = count_round_trips(monkeypatch)
    with audit.acting_as("tester"):
        result = archive.archive(store, dispatcher, sid, stop_activity=True)
    monkeypatch.undo()

    # Then it took three round trips, and nothing it promises was left out
    assert len(writes) == ROUND_TRIPS, [w[:80] for w in writes]
    assert b"EVALSHA" in writes[0]  # with its WAITAOF, where the server has it
    assert sum(w.count(b"LPUSH") for w in writes) == 4
    assert set(result.stop_report.sent) == {f.value for f in Family}
    assert result.archived_count == 2
    trail = [(e["action"], e["outcome"]) for e in audit.read(store, sid)]
    assert trail == [("stop", "sent"), ("archive", "archived")]  # newest first
    stream = store.redis.xrange(store.keys.event_stream, "-", "+")[before:]
    # (the shared workers may publish other tests' late turn events meanwhile: only this
    # lineage's count)
    lineage = {sid, *store.redis.smembers(store.keys.children(sid))}
    events = [e for _, f in stream if (e := json.loads(f["event"]))["sessionId"] in lineage]
    assert (events[0]["type"], events[0]["sessionId"]) == ("archived", sid)
    assert [e["type"] for e in events].count("archived") == 2
