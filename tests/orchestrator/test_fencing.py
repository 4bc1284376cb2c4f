"""Fencing tokens (``orchestrator/session/fencing.py``): of two copies of the same step, only the
one
that began last writes.

Each test drives the scripts a step runs, with the tokens two copies would carry: copy A
begins, its lease lapses (its worker froze; the test deletes the lease), copy B begins the
same step (the sweeper or a redelivery), then A resumes and tries every write a step makes.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import StepSuperseded, TurnStopped
from orchestrator.job import scripts as job_scripts
from orchestrator.job.jobs import create_job
from orchestrator.models.model import ScriptedModel
from orchestrator.reminder import scripts as reminder_scripts
from orchestrator.reminder.reminders import create_reminder
from orchestrator.session import scripts as session_scripts
from orchestrator.session import sessions
from orchestrator.session.fencing import StepGuard
from orchestrator.storage.store import Store, iso, new_id, now_ms
from orchestrator.turn import scripts as turn_scripts
from orchestrator.turn import steps, tools, turns
from orchestrator.turn.turns import STOP_REASON, TurnState, sources_of
from tests.helpers import RecordingDispatcher

A, B = "token-of-copy-a", "token-of-copy-b"


@pytest.fixture
def sid(store: Store, cwd: str) -> str:
    return sessions.create_session(store, cwd).session_id


@pytest.fixture
def tid(store: Store, recorder: RecordingDispatcher, sid: str) -> str:
    return turns.start_turn(store, recorder, sid, "say one\nsay two")


def begin(store: Store, tid: str, token: str, index: int = 0) -> str:
    began = turn_scripts.turn_begin_step(
        store, turn_id=tid, index=index, lease_ms=steps.STEP_LEASE_MS, token=token
    )
    if isinstance(began, turn_scripts.Dropped):
        return began.why
    return "ok" if isinstance(began, turn_scripts.Begun) else "refused"


def record(store: Store, tid: str, text: str, token: str, *, settle: bool = False) -> int:
    """What ``turn_record`` answers for ``text`` said by the copy holding ``token``: 1
    appended, 0 the turn stopped, -1 superseded."""
    update = say(tid, text)
    return turn_scripts.turn_record(
        store, turn_id=tid, update_json=update, settle=settle, token=token
    )


def watch(store: Store, tid: str, token: str, *, refresh: bool = True) -> str:
    """What the watch of the copy holding ``token`` reads (refreshing its lease)."""
    lease_ms = steps.STEP_LEASE_MS if refresh else None
    return turn_scripts.turn_watch(store, turn_id=tid, lease_ms=lease_ms, token=token)


def advance(store: Store, tid: str, token: str) -> str:
    return turn_scripts.turn_advance(store, turn_id=tid, index=1, token=token)


def lease(store: Store, tid: str) -> str | None:
    value: str | None = store.redis.get(store.keys.step_lease(tid))
    return value


def history(store: Store, sid: str) -> list[dict[str, object]]:
    return [json.loads(h) for h in store.redis.lrange(store.keys.history(sid), 0, -1)]


def say(tid: str, text: str) -> str:
    return json.dumps(
        {"sessionUpdate": "agent_message_chunk", "turnId": tid, "content": {"text": text}}
    )


def launches(store: Store, sid: str, tid: str, token: str) -> list[object]:
    """Every tool launch a step makes, as its script sees it: job, reminder, subagent (its
    session, then its first turn); ``stopped`` for each one refused because that copy of
    the step no longer owns it."""
    ms = now_ms()
    guard = StepGuard(tid, token)
    caps = 100  # each launch's FLEET_MAX_* limit, far above what these tests create
    job = job_scripts.job_create(
        store,
        job_id=new_id("job"),
        session_id=sid,
        label="j",
        seconds=1,
        now_iso=iso(ms),
        start_timeout_ms=30_000,
        guard=guard,
        max_live=caps,
        command="",
    )
    due = reminder_scripts.reminder_create(
        store,
        reminder_id=new_id("rem"),
        session_id=sid,
        prompt="p",
        label="p",
        delay_ms=60_000,
        due_at=iso(ms),
        created_at=iso(ms),
        guard=guard,
        max_live=caps,
    )
    child = session_scripts.create_session(
        store,
        session_id=new_id("sess"),
        cwd="/tmp/f",
        cwd_hash="h",
        parent_id=sid,
        now_ms=ms,
        now_iso=iso(ms),
        guard=guard,
        max_depth=caps,
        max_children=caps,
        model=None,
        idempotency=None,
    )
    turn = turn_scripts.turn_create(
        store,
        session_id=sid,
        turn_id=new_id("turn"),
        prompt="p",
        label="p",
        source="subagent",
        now_ms=ms,
        now_iso=iso(ms),
        guard=guard,
    )
    return [
        "ok" if isinstance(job, job_scripts.Stored) else "stopped",
        due.due_ms if isinstance(due, reminder_scripts.Armed) else "stopped",
        child.reason if isinstance(child, session_scripts.Refused) else "created",
        turn.outcome if isinstance(turn, turn_scripts.Stored) else "stopped",
    ]


def created(store: Store, sid: str) -> tuple[int, int, int, int]:
    """What the session holds: (jobs, reminders, subagents, live turns)."""
    k = store.keys
    return (
        store.redis.scard(k.live_jobs(sid)),
        store.redis.scard(k.live_reminders(sid)),
        store.redis.scard(k.children(sid)),
        store.redis.zcard(k.live_turns(sid)),
    )


def finish(store: Store, tid: str, state: TurnState, token: str) -> list[str]:
    """What ``turn_finish`` answers the copy holding ``token``, as the script's reply."""
    ms = now_ms()
    ended = turn_scripts.turn_finish(
        store,
        turn_id=tid,
        state=state,
        stop_reason=STOP_REASON[state],
        error="",
        allowed_from=sources_of(state),
        now_ms=ms,
        now_iso=iso(ms),
        token=token,
    )
    if isinstance(ended, turn_scripts.Finished):
        return ["finished", ended.promoted]
    if isinstance(ended, turn_scripts.NotMoved):
        return ["noop", ended.state]
    return ["superseded"]


def test_a_copy_whose_lease_lapsed_and_another_copy_began_writes_nothing_and_the_new_copy_writes(
    store: Store, sid: str, tid: str
) -> None:
    # Given copy A began step 0, its lease lapsed (its worker froze), and copy B began step 0
    assert begin(store, tid, A) == "ok"
    store.redis.delete(store.keys.step_lease(tid))
    assert begin(store, tid, B) == "ok"
    said = len(history(store, sid))

    # When A resumes, every write it tries is refused
    assert record(store, tid, "from A", A) == -1
    assert record(store, tid, "from A", A, settle=True) == -1
    assert launches(store, sid, tid, A) == ["stopped", "stopped", "stopped", "stopped"]
    assert watch(store, tid, A) == "superseded"
    assert advance(store, tid, A) == "superseded"
    assert finish(store, tid, TurnState.COMPLETED, A) == ["superseded"]
    assert finish(store, tid, TurnState.FAILED, A) == ["superseded"]
    # Then nothing of A landed, and B still holds the step: the turn runs at step 0
    assert len(history(store, sid)) == said
    assert created(store, sid) == (0, 0, 0, 1)
    assert lease(store, tid) == B
    t = turns.get_turn(store, tid)
    assert t is not None and t.state is TurnState.RUNNING and t.step == 0

    # And B's writes all succeed: its answer, its launches, its lease, its advance
    assert record(store, tid, "from B", B) == 1
    job, due, child, turn = launches(store, sid, tid, B)
    assert (job, isinstance(due, int), child, turn) == ("ok", True, "created", "queued")
    assert created(store, sid) == (1, 1, 1, 2)
    assert watch(store, tid, B) == "running"
    assert advance(store, tid, B) == "ok"
    texts = [
        h["content"] for h in history(store, sid) if h["sessionUpdate"] != "user_message_chunk"
    ]
    assert texts == [{"text": "from B"}]


def test_a_superseded_copy_does_not_end_the_turn_and_the_new_copy_does(
    store: Store, tid: str
) -> None:
    # Given A began, lapsed, and B began the last step (the turn advanced to step 1 by hand)
    assert begin(store, tid, A) == "ok"
    assert advance(store, tid, A) == "ok"
    assert begin(store, tid, A, 1) == "ok"
    store.redis.delete(store.keys.step_lease(tid))
    assert begin(store, tid, B, 1) == "ok"
    # When A tries to end the turn, it is refused; B ends it
    assert finish(store, tid, TurnState.COMPLETED, A) == ["superseded"]
    assert finish(store, tid, TurnState.COMPLETED, B) == ["finished", ""]
    t = turns.get_turn(store, tid)
    assert t is not None and t.state is TurnState.COMPLETED


def test_a_lapsed_lease_is_retaken_by_its_own_copy_when_no_other_copy_began(
    store: Store, sid: str, tid: str
) -> None:
    # Given copy A began and its lease lapsed, and nobody began the step since
    assert begin(store, tid, A) == "ok"
    store.redis.delete(store.keys.step_lease(tid))
    # When A writes, the write lands and re-takes the lease in the same script
    assert record(store, tid, "from A", A) == 1
    assert lease(store, tid) == A
    # Then a copy that begins now is dropped as a duplicate of a step in flight
    assert begin(store, tid, B) == "inflight"
    # And the watch re-takes a lapsed lease too, rather than reporting A superseded
    store.redis.delete(store.keys.step_lease(tid))
    assert watch(store, tid, A, refresh=False) == "running"
    assert lease(store, tid) == A


def test_a_copy_is_superseded_for_good_once_another_began_even_after_that_one_moved_on(
    store: Store, tid: str
) -> None:
    # Given A began, lapsed, B began and advanced the turn (no lease is held now)
    assert begin(store, tid, A) == "ok"
    store.redis.delete(store.keys.step_lease(tid))
    assert begin(store, tid, B) == "ok"
    assert advance(store, tid, B) == "ok"
    assert lease(store, tid) is None
    # Then A re-takes nothing and writes nothing
    assert record(store, tid, "late", A) == -1
    assert watch(store, tid, A) == "superseded"
    assert lease(store, tid) is None


def test_stops_act_on_the_turn_whoever_holds_the_step(
    store: Store, recorder: RecordingDispatcher, sid: str, tid: str
) -> None:
    # Given A was superseded by B, which is in flight
    assert begin(store, tid, A) == "ok"
    store.redis.delete(store.keys.step_lease(tid))
    assert begin(store, tid, B) == "ok"
    # When the user cancels the turn, it is cancelling (B's step settles it)
    assert turns.cancel_turns(store, recorder, sid, [tid]) == {tid: "cancelling"}
    # Then A can settle nothing, B can
    assert finish(store, tid, TurnState.CANCELLED, A) == ["superseded"]
    assert finish(store, tid, TurnState.CANCELLED, B) == ["finished", ""]


def test_the_python_seams_raise_for_a_superseded_copy(
    store: Store, recorder: RecordingDispatcher, sid: str, tid: str
) -> None:
    # Given A was superseded by B
    assert begin(store, tid, A) == "ok"
    store.redis.delete(store.keys.step_lease(tid))
    assert begin(store, tid, B) == "ok"
    old = StepGuard(tid, A)
    update: dict[str, object] = {"sessionUpdate": "agent_message_chunk", "turnId": tid}
    # Then A's conversation write and its end raise StepSuperseded, its launches TurnStopped
    with pytest.raises(StepSuperseded):
        turns.record_update(store, sid, update, token=A)
    with pytest.raises(StepSuperseded):
        turns.finish(store, recorder, tid, TurnState.COMPLETED, token=A)
    with pytest.raises(TurnStopped):
        create_job(store, recorder, sid, 1, "j", guard=old)
    with pytest.raises(TurnStopped):
        create_reminder(store, sid, 60, "p", guard=old)
    with pytest.raises(TurnStopped):
        sessions.create_session(store, "/tmp/f", parent_id=sid, guard=old)
    # And B's step, run as a worker runs it (its own fresh token), is dropped as in flight
    model = ScriptedModel()
    assert steps.run_step(store, recorder, model, tools.run_tool, sid, tid, 0) == "inflight"


def test_a_copy_that_advanced_the_turn_cannot_retake_a_lease_for_the_next_step(
    store: Store, tid: str
) -> None:
    # Given copy A ran step 0 and advanced the turn (its lease dropped)
    assert begin(store, tid, A) == "ok"
    assert advance(store, tid, A) == "ok"
    # When a late poll of A's watch arrives, it re-takes nothing
    assert watch(store, tid, A) == "superseded"
    assert lease(store, tid) is None
    # Then step 1 begins on the copy it was sent to
    assert begin(store, tid, B, 1) == "ok"
