"""Durability of lifecycle writes across a Redis crash (docs/configuration.md, "Durability").

Redis runs with ``appendonly yes`` and ``appendfsync always`` (``localfleet/embedded.py``), so a
write the server acknowledged is on disk. Each test here makes writes through the orchestrator,
kills the server with SIGKILL (no chance to flush anything) right after the last call returned,
restarts it on the same state directory and port, and reads everything back through the same
``Store`` object: the archive, its gate, a refusal, a title and an unarchive all survived.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from localfleet.embedded import EmbeddedRedis
from orchestrator.archiving import archive
from orchestrator.errors import SessionActive
from orchestrator.reminder import reminders
from orchestrator.session import gate, sessions, titles
from orchestrator.session.gate import StepRefused
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, wait_for

pytestmark = pytest.mark.redis

#: Crash/restart cycles of the loop test.
CYCLES = 20


def crash_and_restart(server: EmbeddedRedis) -> None:
    """SIGKILL the server (no shutdown, no final fsync), then start it again on the same
    state directory and port."""
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not server.running, timeout=5, message="redis-server to die")
    server.stop()  # reaps the process; the append-only file is left as the crash left it
    server.start()


def cwd() -> str:
    return f"/tmp/fleet-faults/{uuid.uuid4().hex}"


def test_lifecycle_writes_survive_a_sigkill_right_after_they_answered(
    private_redis: EmbeddedRedis,
) -> None:
    # Given sessions in every lifecycle state this test writes just before the crash
    store = Store(private_redis.url, "dur:")
    rec = RecordingDispatcher()
    where = cwd()
    parent = sessions.create_session(store, where)
    child = sessions.create_session(store, where, parent_id=parent.session_id)
    busy = sessions.create_session(store, where)
    reminders.create_reminder(store, busy.session_id, 3600, "say later")
    titled = sessions.create_session(store, where)
    restored = sessions.create_session(store, where)
    archive.archive(store, rec, restored.session_id)

    # When a refusal, a title, an unarchive and an archive answer, and Redis is SIGKILLed
    with pytest.raises(SessionActive):
        archive.archive(store, rec, busy.session_id)
    titles.set_title(store, titled.session_id, "Survives the crash")
    assert archive.unarchive(store, restored.session_id) == 1
    result = archive.archive(store, rec, parent.session_id, stop_activity=True)
    assert result.outcome == "archived"
    crash_and_restart(private_redis)

    # Then the same Store object reads it all back
    for sid in (parent.session_id, child.session_id):
        assert sessions.get_session(store, sid).archived
        with pytest.raises(StepRefused) as refused:
            gate.admit(store, sid)
        assert refused.value.reason == "archived"
    only = {
        s.session_id for s in sessions.list_sessions(store, archived="only", cwd=where).sessions
    }
    assert only == {parent.session_id, child.session_id}
    active = {s.session_id for s in sessions.list_sessions(store, cwd=where).sessions}
    assert active == {busy.session_id, titled.session_id, restored.session_id}
    assert not sessions.get_session(store, busy.session_id).archived
    outcomes = [e["outcome"] for e in audit.read(store, busy.session_id)]
    assert "refused" in outcomes
    assert sessions.get_session(store, titled.session_id).title == "Survives the crash"
    assert not sessions.get_session(store, restored.session_id).archived
    gate.admit(store, restored.session_id)  # unarchived: admitted
    # And the unarchived session can be archived again with the same client
    archive.archive(store, rec, restored.session_id)
    assert sessions.get_session(store, restored.session_id).archived
    store.close()


def test_no_archive_is_lost_over_repeated_crashes(private_redis: EmbeddedRedis) -> None:
    store = Store(private_redis.url, "dur:")
    rec = RecordingDispatcher()
    where = cwd()
    archived: list[str] = []
    for cycle in range(CYCLES):
        # Given a fresh parent and child, archived (with stopActivity on odd cycles)
        root = sessions.create_session(store, where)
        kid = sessions.create_session(store, where, parent_id=root.session_id)
        out = archive.archive(store, rec, root.session_id, stop_activity=bool(cycle % 2))
        assert out.archived_count == 2
        archived += [root.session_id, kid.session_id]
        # When Redis is SIGKILLed right after the archive answered, and restarted
        crash_and_restart(private_redis)
        # Then every archive so far is still there and still gates
        members = store.redis.smembers(store.keys.archived)
        assert set(archived) <= members, f"cycle {cycle}: lost {set(archived) - members}"
        for sid in (root.session_id, kid.session_id):
            with pytest.raises(StepRefused):
                gate.admit(store, sid)
    listed = sessions.list_sessions(store, archived="only", cwd=where, limit=200).sessions
    assert {s.session_id for s in listed} == set(archived)
    assert len(archived) == 2 * CYCLES
    store.close()
