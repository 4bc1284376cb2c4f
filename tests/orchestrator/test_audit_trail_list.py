"""A session's audit trail is a list (``Keys.audit_log``) holding each entry with the id the
fleet-wide stream gave it: a stream per session cost 4.7 KB from its first entry on Redis
>= 7.0 (its first node is preallocated at ``stream-node-max-bytes``), which every archived
session carried. Entries a session got before (in a stream of its own, ``Keys.audit``) are
still read, merged with the list in id order, and paged across with ``before``."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import archive, audit, bookkeeping, sessions, titles, turns
from orchestrator.store import Store
from tests.helpers import RecordingDispatcher, count_round_trips

pytestmark = pytest.mark.redis


def _legacy_entry(store: Store, sid: str, title: str) -> str:
    """An entry as the stream-per-session code wrote it, a minute before now (older code wrote
    them before the upgrade; ids of two streams made in the same millisecond do not order the
    entries); returns its id."""
    fields = {
        "at": "2026-11-01T00:00:00.000Z",
        "action": "set_title",
        "outcome": "set",
        "actor": "old-api",
        "sessionId": sid,
        "detail": audit.detail_json({"title": title}),
    }
    key = store.keys.audit(sid)
    last = store.redis.xinfo_stream(key)["last-generated-id"] if store.redis.exists(key) else ""
    ms = store.now_ms() - 60_000
    seq = int(last.split("-")[1]) + 1 if last.startswith(f"{ms}-") else 0
    return str(store.redis.xadd(key, fields, id=f"{ms}-{seq}"))  # type: ignore[arg-type]


def _titles(entries: list[dict[str, Any]]) -> list[str]:
    return [e["detail"]["title"] for e in entries]


def test_an_archived_sessions_trail_costs_hundreds_of_bytes_not_a_stream_node(
    store: Store, recorder: RecordingDispatcher, tmp_path: Any
) -> None:
    # Given a session archived (one audit entry, written by the archive's own script)
    sid = sessions.create_session(store, str(tmp_path)).session_id
    archive.archive(store, recorder, sid)
    # Then its trail is one list entry, far below a stream's first node (4,736 bytes)
    assert store.redis.type(store.keys.audit_log(sid)) == "list"
    assert not store.redis.exists(store.keys.audit(sid))
    assert store.redis.memory_usage(store.keys.audit_log(sid)) < 600
    # And the entry carries the fleet-wide stream's id for it
    (entry,) = audit.read(store, sid)
    assert store.redis.xrange(store.keys.audit_all, entry["id"], entry["id"])


def test_entries_of_the_older_per_session_stream_are_read_with_the_list_in_id_order(
    store: Store, tmp_path: Any
) -> None:
    # Given a session with two entries in its stream (older code) and two in its list
    sid = sessions.create_session(store, str(tmp_path)).session_id
    _legacy_entry(store, sid, "old 1")
    _legacy_entry(store, sid, "old 2")
    titles.set_title(store, sid, "new 1")
    titles.set_title(store, sid, "new 2")
    # When its trail is read whole, and one entry per page
    whole = audit.read(store, sid)
    pages: list[dict[str, Any]] = []
    while True:
        page = audit.read(store, sid, 1, pages[-1]["id"] if pages else None)
        if not page:
            break
        pages += page
    # Then both read newest first, each entry once, with its session and actor
    assert _titles(whole) == ["new 2", "new 1", "old 2", "old 1"]
    assert pages == whole
    assert {e["sessionId"] for e in whole} == {sid}
    assert [e["actor"] for e in whole][2:] == ["old-api", "old-api"]


def test_entries_recorded_together_are_one_round_trip_and_get_the_fleet_wide_ids(
    store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two sessions, and the recording script loaded once
    a = sessions.create_session(store, str(tmp_path)).session_id
    b = sessions.create_session(store, str(tmp_path)).session_id
    audit.record(store, a, "close", "closed")
    # When an entry each is recorded at once
    writes = count_round_trips(monkeypatch)
    ids = audit.record_many(
        store, [(a, "delete", "deleted", {"n": 1}), (b, "delete", "deleted", {"n": 2})]
    )
    monkeypatch.undo()
    # Then it took one round trip (the script reads the server's clock itself), and each
    # session's trail holds its entry under the id the fleet-wide stream gave it
    assert len(writes) == 1, [w[:60] for w in writes]
    assert [audit.read(store, a, 1)[0]["id"], audit.read(store, b, 1)[0]["id"]] == ids
    fleet_wide = {e["id"]: e["sessionId"] for e in audit.read(store, None, 50)}
    assert [fleet_wide[i] for i in ids] == [a, b]


def test_an_entry_written_late_is_timed_when_written_so_time_and_id_sort_alike(
    store: Store, tmp_path: Any
) -> None:
    # Given a busy session archived with stopActivity whose stop bookkeeping is deferred (as
    # over HTTP), then unarchived before that bookkeeping is written
    sid = sessions.create_session(store, str(tmp_path)).session_id
    turns.start_turn(store, RecordingDispatcher(), sid, "think 600")
    later: list[bookkeeping.Fill] = []
    archive.archive(store, RecordingDispatcher(), sid, stop_activity=True, defer=later.append)
    archive.unarchive(store, sid)
    bookkeeping.write(store, later)
    # When its trail is read
    entries = audit.read(store, sid)
    # Then the stop entry comes first (newest), and the times never go up down the list
    assert [e["action"] for e in entries] == ["stop", "unarchive", "archive"]
    times = [e["at"] for e in entries]
    assert times == sorted(times, reverse=True)
