"""Bulk archive (``orchestrator/archiving/bulk.py``): batching, per-session outcomes, dry runs,
subtree
semantics, caps, and one stop message per family per batch. No worker runs here: the
``recorder`` is the dispatcher and ``deliver`` plays the workers' part."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import redis

from orchestrator.archiving import archive, archive_run, bulk
from orchestrator.census.activity import census
from orchestrator.errors import InvalidParams, SessionActive, StoreUnavailable, TooManySessions
from orchestrator.families import Task
from orchestrator.job import jobs
from orchestrator.reminder import reminders
from orchestrator.session import scripts as session_scripts
from orchestrator.session import sessions
from orchestrator.session.sessions import Session
from orchestrator.storage import audit, events, metrics
from orchestrator.storage.store import Store, iso, now_ms
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import (
    STOP_MANY_TASKS,
    STOP_TASKS,
    FailingDispatcher,
    chain,
    claim_job,
    deliver,
    unique_cwd,
)

UNKNOWN = "sess_" + "0" * 24


def new(store: Store, cwd: str, title: str | None = None, parent: str | None = None) -> str:
    sid = sessions.create_session(store, cwd, parent_id=parent).session_id
    if title is not None:
        session_scripts.set_title(store, session_id=sid, title=title, source="client")
    return sid


def read(store: Store, sid: str) -> Session:
    return sessions.get_session(store, sid)


def outcomes(result: bulk.BulkResult) -> dict[str, str]:
    return {item.session_id: item.outcome for item in result.results}


def backdate(store: Store, sid: str, ms: int) -> None:
    """Move a session's last activity to ``ms`` (hash and every listing index)."""
    k = store.keys
    cwd_hash = store.redis.hget(k.session(sid), "cwdHash")
    store.redis.hset(k.session(sid), mapping={"updatedMs": ms, "updatedAt": iso(ms)})
    for state in ("all", "active", "archived"):
        for key in (k.index(state), k.index(state, cwd_hash)):
            store.redis.zadd(key, {sid: ms}, xx=True)


def snapshot(store: Store, ids: list[str], cwd: str) -> dict[str, Any]:
    """Everything an archive could change for these sessions."""
    k = store.keys
    return {
        "hashes": {sid: store.redis.hgetall(k.session(sid)) for sid in ids},
        "archived": sorted(s for s in ids if store.redis.sismember(k.archived, s)),
        "indexes": {
            state: store.redis.zrange(
                k.index(state, sessions.cwd_hash(cwd)), 0, -1, withscores=True
            )
            for state in ("all", "active", "archived")
        },
    }


class Busy:
    """A session with one live item of every family: a running turn, a job claimed on
    ``host``, an armed reminder and a subagent with a running turn of its own."""

    def __init__(self, store: Store, recorder: RecordingDispatcher, cwd: str, host: str) -> None:
        self.sid = new(store, cwd)
        self.turn = turns.start_turn(store, recorder, self.sid, "think 5")
        self.job = jobs.create_job(store, recorder, self.sid, 30, "sleep 30s")
        assert claim_job(store, self.job, host) == "ok"
        self.reminder = reminders.create_reminder(store, self.sid, 60, "say hi")
        self.child = new(store, cwd, parent=self.sid)
        self.child_turn = turns.start_turn(
            store, recorder, self.child, "think 5", source="subagent"
        )


class RoundTrips:
    """Counts Redis round trips: plain commands and pipeline executions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        plain = redis.Redis.execute_command
        execute = redis.client.Pipeline.execute

        def counted_command(client: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return plain(client, *args, **kwargs)

        def counted_execute(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return execute(pipe, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "execute_command", counted_command)
        monkeypatch.setattr(redis.client.Pipeline, "execute", counted_execute)


# --------------------------------------------------------------------------- outcomes


def test_each_session_gets_the_outcome_a_single_archive_would_give(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a quiet session, an archived one, a busy one, a deleted one, an unknown id and a
    # malformed one
    quiet = new(store, cwd)
    done = new(store, cwd)
    archive.archive(store, recorder, done)
    busy = new(store, cwd)
    rid = reminders.create_reminder(store, busy, 60, "later")
    gone = new(store, cwd)
    sessions.delete_session(store, gone)
    ids = [quiet, done, busy, gone, UNKNOWN, "../x"]
    # When they are archived in bulk without stopActivity
    result = bulk.bulk_archive(store, recorder, session_ids=ids)
    # Then each outcome is the single archive's, in the order given
    assert [i.session_id for i in result.results] == ids
    assert outcomes(result) == {
        quiet: "archived",
        done: "already_archived",
        busy: "refused",
        gone: "not_found",
        UNKNOWN: "not_found",
        "../x": "not_found",
    }
    # And the refused one carries its live items, and stays as it was
    refused = result.results[2]
    assert refused.activity is not None
    assert [(a.family.value, a.id) for a in refused.activity] == [("reminder", rid)]
    assert read(store, busy).archived is False
    assert read(store, quiet).archived is True
    assert result.totals == {
        "archived": 1,
        "already_archived": 1,
        "refused": 1,
        "not_found": 3,
        "skipped": 0,
        "selected": 6,
    }
    assert recorder.sent == []


def test_the_wire_shape_lists_totals_results_and_live_items_of_refusals(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    quiet, busy = new(store, cwd), new(store, cwd)
    reminders.create_reminder(store, busy, 60, "later")
    wire = bulk.bulk_archive(store, recorder, session_ids=[quiet, busy]).to_wire()
    assert wire["totals"]["archived"] == 1 and wire["totals"]["refused"] == 1
    assert wire["results"][0] == {"sessionId": quiet, "outcome": "archived"}
    assert wire["results"][1]["outcome"] == "refused"
    assert [a["family"] for a in wire["results"][1]["activity"]] == ["reminder"]
    assert wire["dryRun"] is False and wire["batches"] == 1
    assert wire["stopDispatch"] == {"sent": {}, "failed": []}
    json.dumps(wire)


def test_duplicate_ids_are_archived_once(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = new(store, cwd)
    result = bulk.bulk_archive(store, recorder, session_ids=[sid, sid, sid])
    assert outcomes(result) == {sid: "archived"}
    assert result.totals["selected"] == 1


def test_named_ids_are_written_ancestors_first_and_answered_in_the_order_named(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a lineage parent -> child -> grandchild, named leaves first
    parent = new(store, cwd)
    child = new(store, cwd, parent=parent)
    grandchild = new(store, cwd, parent=child)
    result = bulk.bulk_archive(store, recorder, session_ids=[grandchild, "nope", child, parent])
    # Then the parent's transition archived the whole subtree, as a filter's would
    assert [(i.session_id, i.outcome) for i in result.results] == [
        (grandchild, "already_archived"),
        ("nope", "not_found"),
        (child, "already_archived"),
        (parent, "archived"),
    ]
    # And unarchiving the parent restores all three, whatever order they were named in
    assert archive.unarchive(store, parent) == 3
    assert not any(read(store, sid).archived for sid in (parent, child, grandchild))


def test_an_empty_id_list_selects_nothing(store: Store, recorder: RecordingDispatcher) -> None:
    result = bulk.bulk_archive(store, recorder, session_ids=[])
    assert result.totals["selected"] == 0 and result.batches == 0


def test_archived_sessions_publish_events_to_the_durable_stream(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    a, b = new(store, cwd), new(store, cwd)
    top = store.redis.xrevrange(store.keys.event_stream, count=1)
    since = top[0][0] if top else "0-0"
    bulk.bulk_archive(store, recorder, session_ids=[a, b])
    later = store.redis.xrange(store.keys.event_stream, f"({since}", "+")
    payloads = [json.loads(fields["event"]) for _, fields in later]
    mine = [p for p in payloads if p["sessionId"] in (a, b)]
    assert mine == [
        {"type": "archived", "sessionId": a, "archived": True, "historyLength": 0},
        {"type": "archived", "sessionId": b, "archived": True, "historyLength": 0},
    ]


def test_every_descendant_a_bulk_archive_archives_gets_its_event(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    parent = new(store, cwd)
    child = sessions.create_session(store, cwd, parent_id=parent).session_id
    grandchild = sessions.create_session(store, cwd, parent_id=child).session_id
    top = store.redis.xrevrange(store.keys.event_stream, count=1)
    since = top[0][0] if top else "0-0"
    bulk.bulk_archive(store, recorder, session_ids=[parent])
    later = store.redis.xrange(store.keys.event_stream, f"({since}", "+")
    payloads = [json.loads(fields["event"]) for _, fields in later]
    archived = [p["sessionId"] for p in payloads if p["type"] == "archived"]
    assert archived == [parent, child, grandchild]


def test_a_batchs_events_commit_with_its_script(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a busy session (a running turn) with an idle child, and a process that can no
    # longer publish anything itself once the batch's script has run
    parent = new(store, cwd)
    child = new(store, cwd, parent=parent)
    turn = turns.start_turn(store, recorder, parent, "think 5")
    top = store.redis.xrevrange(store.keys.event_stream, count=1)
    since = top[0][0] if top else "0-0"
    monkeypatch.setattr(events, "publish_many", lambda *a, **kw: None)

    bulk.bulk_archive(store, recorder, session_ids=[parent, child], stop_activity=True)

    # Then the script itself emitted every archived event, the session before its child,
    # then the turn it stopped
    later = store.redis.xrange(store.keys.event_stream, f"({since}", "+")
    payloads = [json.loads(fields["event"]) for _, fields in later]
    assert [(p["type"], p["sessionId"]) for p in payloads] == [
        ("archived", parent),
        ("archived", child),
        ("turn", parent),
    ]
    assert payloads[0] == {
        "type": "archived",
        "sessionId": parent,
        "archived": True,
        "historyLength": store.redis.llen(store.keys.history(parent)),
    }
    assert payloads[2] == {
        "type": "turn",
        "sessionId": parent,
        "turnId": turn,
        "state": "cancelled",
        "stopReason": "cancelled",
    }


# --------------------------------------------------------------------------- batching


def test_sessions_are_written_in_batches_one_script_each(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [new(store, cwd) for _ in range(12)]
    scripts: list[int] = []
    run = Store.run

    def counting(self: Store, name: str, args: list[Any], **kw: Any) -> Any:
        if name == "archive":
            scripts.append(sum(1 for a in args if a in ids))  # the sessions of this batch
        return run(self, name, args, **kw)

    monkeypatch.setattr(Store, "run", counting)
    progress: list[tuple[int, int]] = []

    result = bulk.bulk_archive(
        store,
        recorder,
        session_ids=ids,
        batch_size=5,
        progress=lambda done, total: progress.append((done, total)),
    )

    assert scripts == [5, 5, 2]
    assert result.batches == 3
    assert progress == [(0, 12), (5, 12), (10, 12), (12, 12)], "sessions done, of all"
    assert all(read(store, sid).archived for sid in ids)


def test_idle_sessions_cost_a_constant_number_of_round_trips_per_batch(
    store: Store, recorder: RecordingDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The audit trail writes one entry per session (orchestrator/storage/audit.py); it is left out
    # here: this is about the archive itself, its census and its stops.
    monkeypatch.setattr(audit, "record", lambda *a, **k: None)

    def trips(count: int) -> int:
        cwd = unique_cwd()
        ids = [new(store, cwd) for _ in range(count)]
        counter = RoundTrips(monkeypatch)
        result = bulk.bulk_archive(
            store, recorder, session_ids=ids, stop_activity=True, batch_size=500
        )
        monkeypatch.undo()
        monkeypatch.setattr(audit, "record", lambda *a, **k: None)
        assert result.totals["archived"] == count
        return counter.count

    # One batch of 10 idle sessions costs what one batch of 200 costs
    assert trips(10) == trips(200)
    assert trips(200) <= 12
    assert recorder.sent == []


def test_a_busy_batch_reads_the_census_in_a_few_pipelined_round_trips(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "record", lambda *a, **k: None)
    monkeypatch.setattr(metrics, "incr_many", lambda *a, **k: None)
    ids = [new(store, cwd) for _ in range(30)]
    for sid in ids:
        reminders.create_reminder(store, sid, 60, "later")
    counter = RoundTrips(monkeypatch)
    result = bulk.bulk_archive(store, recorder, session_ids=ids, stop_activity=True)
    assert result.totals["archived"] == 30
    # script (+WAITAOF in its pipeline), events, census (children, own lists, own records)
    assert counter.count <= 8
    monkeypatch.undo()
    deliver(store, recorder, recorder.sent)
    assert all(census(store, sid) == [] for sid in ids)


# --------------------------------------------------------------------------- stops


def test_one_stop_message_per_family_per_batch(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given six busy sessions (every family; jobs on two hosts)
    busy = [Busy(store, recorder, cwd, host=f"host{i % 2}") for i in range(6)]
    before = len(recorder.sent)
    # When they are archived with stopActivity, three per batch
    result = bulk.bulk_archive(
        store, recorder, session_ids=[b.sid for b in busy], stop_activity=True, batch_size=3
    )
    # Then all are archived, and each batch sent one message per family (jobs: per host)
    assert result.totals["archived"] == 6 and result.batches == 2
    sent = recorder.sent[before:]
    assert not [m for m in sent if m[0] in STOP_TASKS]
    per_batch = Counter((task, queue) for task, _, queue in sent)
    assert per_batch == {
        (Task.TURN_STOP_MANY, "turn.ctl"): 2,
        (Task.JOB_STOP_MANY, "job.ctl.host0"): 2,
        (Task.JOB_STOP_MANY, "job.ctl.host1"): 2,
        (Task.SUBAGENT_STOP_MANY, "subagent.ctl"): 2,
        (Task.REMINDER_STOP_MANY, "reminder.ctl"): 2,
    }
    # And each message names the sessions of its batch and exactly their items
    first = [m for m in sent if m[0] == Task.TURN_STOP_MANY][0]
    assert first[1] == [{b.sid: [b.turn] for b in busy[:3]}]
    reminder_msgs = [m[1][0] for m in sent if m[0] == Task.REMINDER_STOP_MANY]
    assert reminder_msgs == [{b.sid: [b.reminder] for b in part} for part in (busy[:3], busy[3:])]
    subagent_msgs = [m[1][0] for m in sent if m[0] == Task.SUBAGENT_STOP_MANY]
    assert subagent_msgs[1] == {
        b.sid: {b.child: {"turns": [b.child_turn], "jobs": [], "reminders": []}} for b in busy[3:]
    }
    assert result.stop_report.sent == {"turn": 6, "job": 6, "subagent": 6, "reminder": 6}
    # And once delivered, nothing is left running
    deliver(store, recorder, [m for m in sent if m[0] in STOP_MANY_TASKS])
    for b in busy:
        assert census(store, b.sid) == []
        assert turns.get_turn(store, b.turn).state.value == "cancelled"  # type: ignore[union-attr]
        assert store.redis.hget(store.keys.job(b.job), "state") == "stopped"


def test_idle_sessions_send_no_stop_at_all(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    ids = [new(store, cwd) for _ in range(5)]
    result = bulk.bulk_archive(store, recorder, session_ids=ids, stop_activity=True)
    assert result.totals["archived"] == 5
    assert recorder.sent == []


def test_already_archived_sessions_with_leftover_work_are_asked_to_stop_again(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session whose reminder outlived its stop (the stop was lost)
    sid = new(store, cwd)
    archive.archive(store, recorder, sid)
    rid = reminders.create_reminder(store, sid, 60, "later")
    # When a bulk archive with stopActivity names it
    result = bulk.bulk_archive(store, recorder, session_ids=[sid], stop_activity=True)
    # Then it is already archived, and the reminder is asked to stop again
    assert outcomes(result) == {sid: "already_archived"}
    assert recorder.sent == [(Task.REMINDER_STOP_MANY, [{sid: [rid]}], "reminder.ctl")]
    deliver(store, recorder, recorder.sent)
    assert store.redis.hget(store.keys.reminder(rid), "state") == "deleted"


def test_a_failed_stop_dispatch_is_reported_and_never_undoes_the_archive(
    store: Store, cwd: str
) -> None:
    failing = FailingDispatcher({Task.TURN_STOP_MANY})
    sid = new(store, cwd)
    turns.start_turn(store, failing, sid, "think 5")
    reminders.create_reminder(store, sid, 60, "later")
    result = bulk.bulk_archive(store, failing, session_ids=[sid], stop_activity=True)
    assert outcomes(result) == {sid: "archived"}
    assert read(store, sid).archived is True
    assert [f for f, _ in result.stop_report.failed] == ["turn"]
    assert result.stop_report.sent == {"reminder": 1}


def test_a_batchs_stops_follow_its_own_write_and_all_are_sent_before_it_returns(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given six busy sessions, archived three per batch (a batch's census and stops run on a
    # thread while the next batch is written)
    busy = [Busy(store, recorder, cwd, host="host0") for _ in range(6)]
    before = len(recorder.sent)
    log: list[tuple[str, frozenset[str]]] = []
    run, send = Store.run, recorder.send

    def writing(self: Store, name: str, args: list[Any], **kw: Any) -> Any:
        if name == "archive":
            log.append(("write", frozenset(a for a in args if isinstance(a, str))))
        return run(self, name, args, **kw)

    def sending(task: str, args: list[Any], queue: str) -> None:
        log.append(("stop", frozenset(args[0])))
        send(task, args, queue)

    monkeypatch.setattr(Store, "run", writing)
    monkeypatch.setattr(recorder, "send", sending)
    result = bulk.bulk_archive(
        store, recorder, session_ids=[b.sid for b in busy], stop_activity=True, batch_size=3
    )
    # Then each batch's stops were sent after its own write, and every stop before it returned
    assert result.stop_report.sent == {"turn": 6, "job": 6, "subagent": 6, "reminder": 6}
    assert len(recorder.sent) - before == 8
    for part in ([b.sid for b in busy[:3]], [b.sid for b in busy[3:]]):
        wrote = next(i for i, (kind, ids) in enumerate(log) if kind == "write" and part[0] in ids)
        stops = [i for i, (kind, ids) in enumerate(log) if kind == "stop" and part[0] in ids]
        assert len(stops) == 4 and wrote < min(stops)
        assert all(log[i][1] == frozenset(part) for i in stops)


def test_a_failure_after_a_batchs_write_is_raised_and_its_archives_stay(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two batches of busy sessions, and a step after the first batch's write (reading its
    # census into stops, which settles stale records) that fails on the store
    busy = [Busy(store, recorder, cwd, host="host0") for _ in range(4)]

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("The session store is unavailable: test. Try again shortly.")

    monkeypatch.setattr(archive_run, "census_of_rows", down)
    # When they are archived with stopActivity
    with pytest.raises(StoreUnavailable):
        bulk.bulk_archive(
            store, recorder, session_ids=[b.sid for b in busy], stop_activity=True, batch_size=2
        )
    # Then the failure is the caller's, and the first batch stays archived (as single archives
    # would: the reconciler stops what the census could not)
    assert all(read(store, b.sid).archived for b in busy[:2])


def test_every_audit_entry_of_a_bulk_names_its_caller_also_those_written_after_a_batch(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given two busy sessions, and a caller acting as a REST client
    stopped, refused = Busy(store, recorder, cwd, host="hostA"), Busy(store, recorder, cwd, "hostB")
    # When one is bulk archived with stopActivity and the other without (refused)
    with audit.acting_as("rest:10.0.0.7"):
        bulk.bulk_archive(store, recorder, session_ids=[stopped.sid], stop_activity=True)
        bulk.bulk_archive(store, recorder, session_ids=[refused.sid])
    # Then the entries written after the batch (what its stops sent, the refusal) name the
    # caller, as the entry the batch's script wrote does
    entries = {
        (e["outcome"], e["actor"])
        for sid in (stopped.sid, refused.sid)
        for e in audit.read(store, sid)
    }
    assert entries == {
        ("archived", "rest:10.0.0.7"),
        ("sent", "rest:10.0.0.7"),
        ("refused", "rest:10.0.0.7"),
    }


# --------------------------------------------------------------------------- dry run


def test_a_dry_run_computes_the_outcomes_and_writes_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a mix: quiet sessions, a parent with a child, an archived one, a busy one, and a
    # busy job whose worker died (a real run would mark it lost)
    quiet = [new(store, cwd) for _ in range(3)]
    parent = new(store, cwd)
    child = new(store, cwd, parent=parent)
    done = new(store, cwd)
    archive.archive(store, recorder, done)
    busy = Busy(store, recorder, cwd, host="hostA")
    stale = new(store, cwd)
    jid = jobs.create_job(store, recorder, stale, 30, "x")
    claim_job(store, jid)
    store.redis.delete(store.keys.job_lease(jid))
    ids = [*quiet, parent, child, done, busy.sid, stale, UNKNOWN]
    before = snapshot(store, ids + [busy.child], cwd)
    last = store.redis.xrevrange(store.keys.event_stream, count=1)
    mark = last[0][0] if last else "0"
    sent = len(recorder.sent)
    # When a dry run archives them all, with stopActivity and without
    dry = bulk.bulk_archive(store, recorder, session_ids=ids, dry_run=True, batch_size=2)
    dry_stop = bulk.bulk_archive(
        store, recorder, session_ids=ids, dry_run=True, stop_activity=True, batch_size=2
    )
    # Then nothing was written, sent or published
    assert snapshot(store, ids + [busy.child], cwd) == before
    assert store.redis.hget(store.keys.job(jid), "state") == "running"
    # (the stream is the prefix's: the shared workers may publish for other tests' sessions)
    published = store.redis.xrange(store.keys.event_stream, min=f"({mark}")
    mine = [f["event"] for _, f in published if any(s in f["event"] for s in [*ids, busy.child])]
    assert mine == []
    assert len(recorder.sent) == sent
    assert dry.dry_run is True
    # And the outcomes are exactly those of the real runs (the child rides with its parent,
    # across batches too)
    expected = outcomes(dry)
    assert expected[child] == "already_archived"
    assert expected[busy.sid] == "refused"
    assert outcomes(bulk.bulk_archive(store, recorder, session_ids=ids, batch_size=2)) == expected
    real_stop = bulk.bulk_archive(store, recorder, session_ids=ids, stop_activity=True)
    assert outcomes(dry_stop)[busy.sid] == "archived"
    assert outcomes(real_stop)[busy.sid] == "archived"


# --------------------------------------------------------------------------- subtrees


def test_a_parent_archives_its_subtree_in_one_transition_that_unarchive_restores(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    result = bulk.bulk_archive(store, recorder, session_ids=[root])
    assert outcomes(result) == {root: "archived"}
    txns = {store.redis.hget(store.keys.session(s), "archiveTxn") for s in (root, child)}
    assert len(txns) == 1 and read(store, grandchild).archived
    assert archive.unarchive(store, root) == 3
    assert not any(read(store, s).archived for s in (root, child, grandchild))


def test_a_child_archived_before_its_parent_stays_archived_when_the_parent_is_restored(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # As two single archives would: the child, archived by an earlier request, has a
    # transition of its own (named with its parent in one request, it would share the
    # parent's: ids are written ancestors first)
    root, child, _ = (s.session_id for s in chain(store, 2, cwd))
    assert outcomes(bulk.bulk_archive(store, recorder, session_ids=[child])) == {child: "archived"}
    result = bulk.bulk_archive(store, recorder, session_ids=[child, root])
    assert outcomes(result) == {child: "already_archived", root: "archived"}
    assert archive.unarchive(store, root) == 1
    assert read(store, child).archived is True


def test_a_busy_descendant_refuses_its_ancestor_with_a_subagent_item(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    reminders.create_reminder(store, grandchild, 60, "later")
    result = bulk.bulk_archive(store, recorder, session_ids=[root, child])
    assert outcomes(result) == {root: "refused", child: "refused"}
    items = result.results[0].activity or []
    assert [(a.family.value, a.id) for a in items] == [("subagent", grandchild)]
    with pytest.raises(SessionActive):
        archive.archive(store, recorder, root)
    assert not read(store, root).archived


@pytest.mark.parametrize("chunk", [1000, 2])
def test_a_filter_archives_ancestors_first_so_subtrees_share_their_roots_transition(
    store: Store,
    recorder: RecordingDispatcher,
    cwd: str,
    chunk: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a chain whose deepest session is the oldest (it would be selected first), the
    # index scanned in pages of `chunk` entries (each page reads its entries' depths)
    from orchestrator.archiving import bulk_select

    monkeypatch.setattr(bulk_select, "_SCAN_CHUNK", chunk)
    root, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    backdate(store, grandchild, now_ms() - 60_000)
    # When the cwd is archived by filter
    result = bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd))
    # Then the root went first and took its subtree with it
    assert [i.session_id for i in result.results] == [root, child, grandchild]
    assert outcomes(result) == {
        root: "archived",
        child: "already_archived",
        grandchild: "already_archived",
    }
    assert archive.unarchive(store, root) == 3


# --------------------------------------------------------------------------- filters


def test_a_filter_selects_by_cwd_title_and_idle_time(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    other = unique_cwd()
    old_match = new(store, cwd, "Fix the LOGIN bug")
    old_other_title = new(store, cwd, "Refactor")
    recent_match = new(store, cwd, "login page")
    untitled = new(store, cwd)
    elsewhere = new(store, other, "login elsewhere")
    hour_ago = now_ms() - 3_600_000
    for sid in (old_match, old_other_title, untitled, elsewhere):
        backdate(store, sid, hour_ago - 1000)
    since = iso(hour_ago)

    assert bulk.select(store, bulk.BulkFilter(cwd=cwd, q="Login")) == [old_match, recent_match]
    assert set(bulk.select(store, bulk.BulkFilter(cwd=cwd, idle_since=since))) == {
        old_match,
        old_other_title,
        untitled,
    }
    assert bulk.select(store, bulk.BulkFilter(cwd=cwd, idle_since=since, q="login")) == [old_match]
    assert elsewhere not in bulk.select(store, bulk.BulkFilter(cwd=cwd))
    # Any spelling of the directory selects the same sessions
    for spelled in (cwd + "/", cwd.replace("/", "//"), cwd + "/sub/.."):
        assert bulk.select(store, bulk.BulkFilter(cwd=spelled, q="login")) == [
            old_match,
            recent_match,
        ]
    # An archived session is not selected again
    archive.archive(store, recorder, old_match)
    assert bulk.select(store, bulk.BulkFilter(cwd=cwd, q="login")) == [recent_match]


def test_a_session_active_again_after_selection_is_skipped(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session selected as idle whose activity moves on before its batch is written
    sid = new(store, cwd)
    backdate(store, sid, now_ms() - 3_600_000)
    since = iso(now_ms() - 60_000)
    selected = bulk.select(store, bulk.BulkFilter(cwd=cwd, idle_since=since))
    assert selected == [sid]
    backdate(store, sid, now_ms())
    monkeypatch.setattr(bulk, "select", lambda *a, **k: selected)
    # Then the script that writes sees it and skips it
    result = bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd, idle_since=since))
    assert outcomes(result) == {sid: "skipped"}
    assert read(store, sid).archived is False


@pytest.mark.parametrize(
    "since",
    ["yesterday", "2026-01-01", "2026-01-01T00:00:00", "", "2026-13-01T00:00:00Z"],
)
def test_idle_since_must_be_an_iso_date_time_with_an_offset(
    store: Store, recorder: RecordingDispatcher, cwd: str, since: str
) -> None:
    with pytest.raises(InvalidParams) as caught:
        bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd, idle_since=since))
    assert caught.value.data["param"] == "filter.idleSince"


def test_offsets_are_honoured_in_idle_since() -> None:
    assert bulk.parse_instant("2026-01-01T02:00:00+02:00", "x") == bulk.parse_instant(
        "2026-01-01T00:00:00Z", "x"
    )


# --------------------------------------------------------------------------- caps and errors


def test_more_than_ten_thousand_ids_are_refused_before_anything_is_written(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = new(store, cwd)
    ids = [sid] + [UNKNOWN] * bulk.MAX_IDS
    with pytest.raises(TooManySessions) as caught:
        bulk.bulk_archive(store, recorder, session_ids=ids)
    assert caught.value.data == {"param": "sessionIds", "max": 10_000, "got": 10_001}
    assert "10000" in caught.value.message
    assert read(store, sid).archived is False
    # Exactly the cap is accepted
    result = bulk.bulk_archive(store, recorder, session_ids=ids[: bulk.MAX_IDS])
    assert result.totals["selected"] == 2 and result.totals["archived"] == 1


def test_a_filter_selecting_more_than_the_maximum_is_refused_and_writes_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str, store_with: Any
) -> None:
    ids = [new(store, cwd) for _ in range(4)]
    with pytest.raises(TooManySessions) as caught:
        bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd), max_selected=3)
    assert caught.value.data["max"] == 3
    assert "FLEET_BULK_FILTER_MAX" in caught.value.message
    assert not any(read(store, sid).archived for sid in ids)
    # The configured maximum is the default
    with pytest.raises(TooManySessions):
        bulk.bulk_archive(store_with(bulk_filter_max=3), recorder, flt=bulk.BulkFilter(cwd=cwd))
    assert bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd)).totals["archived"] == 4


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({}, "sessionIds|filter"),
        ({"session_ids": [], "flt": bulk.BulkFilter(cwd="/x")}, "sessionIds|filter"),
        ({"flt": bulk.BulkFilter()}, "filter"),
        ({"flt": bulk.BulkFilter(cwd="relative")}, "filter.cwd"),
        ({"flt": bulk.BulkFilter(q="   ")}, "filter.q"),
        ({"flt": bulk.BulkFilter(q="x" * 201)}, "filter.q"),
        ({"flt": bulk.BulkFilter(idle_since="yesterday")}, "filter.idleSince"),
        ({"session_ids": [1, 2]}, "sessionIds"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(
    store: Store, recorder: RecordingDispatcher, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidParams) as caught:
        bulk.bulk_archive(store, recorder, **kwargs)
    assert caught.value.data["param"] == param
    assert recorder.sent == []


def test_events_publish_many_keeps_conversation_updates_out_of_the_stream(
    store: Store, cwd: str
) -> None:
    sid = new(store, cwd)
    events.publish_many(
        store,
        [("update", sid, {"update": {"x": 1}}), ("title", sid, {"title": "t"})],
    )
    tail = store.redis.xrevrange(store.keys.event_stream, count=5)
    mine = [json.loads(f["event"]) for _, f in tail if json.loads(f["event"])["sessionId"] == sid]
    assert [e["type"] for e in mine] == ["title"]


def test_idle_sessions_are_recorded_quiet_from_their_archive_on(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # As a single archive records it (quietAt in _meta.agentFleet); a busy one is not yet
    root, child = (s.session_id for s in chain(store, 1, cwd))
    busy = new(store, cwd)
    reminders.create_reminder(store, busy, 60, "later")
    bulk.bulk_archive(store, recorder, session_ids=[root, busy], stop_activity=True)
    assert read(store, root).quiet_at is not None
    assert read(store, child).quiet_at == read(store, root).quiet_at
    assert read(store, busy).archived and read(store, busy).quiet_at is None


def _idle_in_order(store: Store, cwd: str, n: int) -> list[str]:
    """``n`` sessions in ``cwd`` whose last activity is in creation order, long ago."""
    ids = [new(store, cwd) for _ in range(n)]
    for i, sid in enumerate(ids):
        backdate(store, sid, 1_000_000 + i)
    return ids


def _archive_during_the_scan(monkeypatch: pytest.MonkeyPatch, change: Any, chunk: int = 5) -> None:
    """Scan in chunks of ``chunk`` entries and call ``change(cursor)`` after each chunk is
    read, before the next: what a concurrent request does between two round trips."""
    from orchestrator.archiving import bulk_select

    real = bulk_select._chunk
    monkeypatch.setattr(bulk_select, "_SCAN_CHUNK", chunk)

    def chunk_then_change(*args: Any) -> Any:
        result = real(*args)
        change([row[0] for row in result[0]])
        return result

    monkeypatch.setattr(bulk_select, "_chunk", chunk_then_change)


def test_a_filter_selects_every_session_though_others_are_archived_during_its_scan(
    store: Store, recorder: RecordingDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 30 idle sessions, oldest first, scanned 5 index entries per round trip
    cwd = unique_cwd()
    ids = _idle_in_order(store, cwd, 30)
    taken: list[str] = []

    def archive_some(read: list[str]) -> None:
        # Between two chunks another request archives two sessions already read, one of
        # them the chunk's last (the scan's place), and the session one further on
        for sid in (read[0], read[-1]):
            archive.archive(store, recorder, sid)
            taken.append(sid)
        nxt = ids.index(read[-1]) + 2
        if nxt < len(ids) and ids[nxt] not in taken:
            archive.archive(store, recorder, ids[nxt])
            taken.append(ids[nxt])

    _archive_during_the_scan(monkeypatch, archive_some)
    # When the filter selects
    selected = bulk.select(store, bulk.BulkFilter(cwd=cwd))
    # Then every session nobody archived meanwhile is selected, each once
    left = [sid for sid in ids if sid not in taken]
    assert left and set(left) <= set(selected)
    assert len(selected) == len(set(selected))


def test_a_session_active_again_during_the_scan_is_selected_once(
    store: Store, recorder: RecordingDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 12 idle sessions scanned 5 entries per round trip
    cwd = unique_cwd()
    ids = _idle_in_order(store, cwd, 12)
    moved: list[str] = []

    def touch_first(read: list[str]) -> None:
        # After the first chunk, a session already read becomes the newest
        if not moved:
            backdate(store, read[0], 2_000_000)
            moved.append(read[0])

    _archive_during_the_scan(monkeypatch, touch_first)
    # When a filter without idleSince selects
    selected = bulk.select(store, bulk.BulkFilter(cwd=cwd))
    # Then it is selected once, with every other session
    assert sorted(selected) == sorted(ids)
