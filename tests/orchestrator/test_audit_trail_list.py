"""A session's audit trail is a list (``Keys.audit_log``) holding each entry with the id the
fleet-wide stream gave it: a stream per session cost 4.7 KB from its first entry on Redis
>= 7.0 (its first node is preallocated at ``stream-node-max-bytes``), which every archived
session carried. The trail is read newest first and paged across with ``before``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.archiving import archive, bulk
from orchestrator.archiving.bulk_select import BulkFilter
from orchestrator.session import sessions, titles
from orchestrator.storage import audit, bookkeeping
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, count_round_trips

pytestmark = pytest.mark.redis


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
    assert store.redis.memory_usage(store.keys.audit_log(sid)) < 600
    # And the entry carries the fleet-wide stream's id for it
    (entry,) = audit.read(store, sid)
    assert store.redis.xrange(store.keys.audit_all, entry["id"], entry["id"])


def test_a_trail_reads_newest_first_whole_and_page_by_page(store: Store, tmp_path: Any) -> None:
    # Given a session with four entries in its trail
    sid = sessions.create_session(store, str(tmp_path)).session_id
    for title in ("one", "two", "three", "four"):
        titles.set_title(store, sid, title)
    # When its trail is read whole, and one entry per page
    whole = audit.read(store, sid)
    pages: list[dict[str, Any]] = []
    while True:
        page = audit.read(store, sid, 1, pages[-1]["id"] if pages else None)
        if not page:
            break
        pages += page
    # Then both read newest first, each entry once, with its session
    assert _titles(whole) == ["four", "three", "two", "one"]
    assert pages == whole
    assert {e["sessionId"] for e in whole} == {sid}


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


def _own_keys(store: Store) -> int:
    """How many keys the store's own prefix holds (other tests write beside it)."""
    return sum(1 for _ in store.redis.scan_iter(match=f"{store.keys.prefix}*", count=1000))


def test_a_bulk_archive_adds_no_key_per_session_and_its_entries_read_as_any_other(
    own_store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given twenty idle sessions with no trail yet, one with a child (the filter selects it
    # too: one request gives it two entries, its parent's and its own)
    ids = [sessions.create_session(own_store, cwd).session_id for _ in range(20)]
    child = sessions.create_session(own_store, cwd, parent_id=ids[0]).session_id
    keys_before = _own_keys(own_store)
    # When they are archived in one bulk request
    with audit.acting_as("bulk-tester"):
        result = bulk.bulk_archive(own_store, recorder, flt=BulkFilter(cwd=cwd))
    assert result.totals["archived"] == 20
    # Then the bulk made no trail key (nor any other key) per session: each entry waits in
    # its batch's hash, named by one short field of the session's hash, which keeps its
    # compact encoding
    made = _own_keys(own_store) - keys_before
    assert made < 10, f"{made} keys added for 21 sessions"
    batches = set()
    for sid in (*ids, child):
        assert not own_store.redis.exists(own_store.keys.audit_log(sid))
        assert own_store.redis.object("encoding", own_store.keys.session(sid)) == "listpack"
        batches.add(own_store.redis.hget(own_store.keys.session(sid), "trailBatch"))
    (batch,) = batches
    assert own_store.redis.hlen(own_store.keys.audit_batch(batch)) == 22  # the child's two
    # And each trail reads as one entry carrying the fleet-wide stream's id
    (entry,) = audit.read(own_store, ids[1])
    assert (entry["action"], entry["outcome"], entry["actor"], entry["sessionId"]) == (
        "bulk_archive",
        "archived",
        "bulk-tester",
        ids[1],
    )
    assert own_store.redis.xrange(own_store.keys.audit_all, entry["id"], entry["id"])
    # And the child, archived with its parent and then found archived, holds both entries
    own, inherited = audit.read(own_store, child)
    assert (own["action"], own["outcome"]) == ("bulk_archive", "already_archived")
    assert inherited["detail"] == {"ancestorId": ids[0]}
    assert inherited["id"] == audit.read(own_store, ids[0])[0]["id"]


def test_an_entry_waiting_in_a_batch_moves_to_the_trail_before_the_next_one(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with a title entry, archived in bulk (its entry waits in its batch)
    sid = sessions.create_session(store, cwd).session_id
    titles.set_title(store, sid, "first")
    bulk.bulk_archive(store, recorder, session_ids=[sid])
    assert store.redis.llen(store.keys.audit_log(sid)) == 1
    batch = store.redis.hget(store.keys.session(sid), "trailBatch")
    # When it is unarchived (an entry written the ordinary way)
    archive.unarchive(store, sid)
    # Then the bulk entry moved to the list first, in order, and left its batch
    listed = [
        json.loads(raw)["action"] for raw in store.redis.lrange(store.keys.audit_log(sid), 0, -1)
    ]
    assert listed == ["set_title", "bulk_archive", "unarchive"]
    assert store.redis.hmget(store.keys.session(sid), "trailBatch", "trail2Batch") == [None, None]
    # (and its batch's hash, holding nothing else, is gone)
    assert not store.redis.exists(store.keys.audit_batch(batch))
    assert [e["action"] for e in audit.read(store, sid)] == [
        "unarchive",
        "bulk_archive",
        "set_title",
    ]
    # And a second bulk entry after a first moves the first (a bulk archive found it archived)
    bulk.bulk_archive(store, recorder, session_ids=[sid])
    bulk.bulk_archive(store, recorder, session_ids=[sid])
    assert [(e["action"], e["outcome"]) for e in audit.read(store, sid)][:2] == [
        ("bulk_archive", "already_archived"),
        ("bulk_archive", "archived"),
    ]


def test_a_waiting_entry_counts_toward_the_trails_cap(
    store_with: Any, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a cap of three entries per session, and a session with three titles
    store = store_with(audit_max_per_session=3)
    sid = sessions.create_session(store, cwd).session_id
    for n in range(3):
        titles.set_title(store, sid, f"title {n}")
    # When it is archived in bulk twice (the second finds it archived): both entries wait
    bulk.bulk_archive(store, recorder, session_ids=[sid])
    bulk.bulk_archive(store, recorder, session_ids=[sid])
    # Then the trail reads the newest three, the list and the waiting entries together
    assert store.redis.llen(store.keys.audit_log(sid)) == 3
    read = [(e["action"], e["outcome"], e["detail"].get("title")) for e in audit.read(store, sid)]
    assert read == [
        ("bulk_archive", "already_archived", None),
        ("bulk_archive", "archived", None),
        ("set_title", "set", "title 2"),
    ]
    # And a third entry moves the two to the list, trimmed to the cap
    bulk.bulk_archive(store, recorder, session_ids=[sid])
    assert store.redis.llen(store.keys.audit_log(sid)) == 3
    outcomes = [e["outcome"] for e in audit.read(store, sid)]
    assert outcomes == ["already_archived", "already_archived", "archived"]


def test_a_third_entry_in_one_batch_moves_the_waiting_ones_in_order_even_unwritten_yet(
    own_store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a child whose trail already has an entry waiting in an earlier batch (as a bulk
    # leaves it), and its parent
    parent = sessions.create_session(own_store, cwd).session_id
    child = sessions.create_session(own_store, cwd, parent_id=parent).session_id
    earlier = {"id": "1-1", "at": "2026-01-01T00:00:00.000Z", "action": "bulk_archive"}
    earlier |= {"outcome": "skipped", "actor": "earlier", "detail": "{}"}
    own_store.redis.hset(own_store.keys.session(child), "trailBatch", "arc-earlier")
    own_store.redis.hset(
        own_store.keys.audit_batch("arc-earlier"), f"{child}:1", json.dumps(earlier)
    )
    # When one bulk request gives it two more in one batch: its parent's archive, then its own
    # (found archived)
    with audit.acting_as("bulk-tester"):
        bulk.bulk_archive(own_store, recorder, session_ids=[child, parent])
    # Then the earlier entry and its parent's moved to the list in that order (the parent's
    # from the batch's entries not written yet), its own waits, and nothing is lost
    listed = [
        json.loads(raw) for raw in own_store.redis.lrange(own_store.keys.audit_log(child), 0, -1)
    ]
    assert [(e["actor"], e["outcome"]) for e in listed] == [
        ("earlier", "skipped"),
        ("bulk-tester", "archived"),
    ]
    assert json.loads(listed[1]["detail"]) == {"ancestorId": parent}
    assert [(e["outcome"], e["detail"]) for e in audit.read(own_store, child)][:2] == [
        ("already_archived", {"stopActivity": False}),
        ("archived", {"ancestorId": parent}),
    ]
    assert not own_store.redis.exists(own_store.keys.audit_batch("arc-earlier"))
    assert own_store.redis.hget(own_store.keys.session(child), "trail2Batch") is None
