"""The step gate: admits normal sessions, refuses archived lineages, fails closed."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from orchestrator.archiving import archive
from orchestrator.errors import AncestorArchived, SessionNotFound, StoreUnavailable
from orchestrator.models.model import ScriptedModel
from orchestrator.session import gate, sessions
from orchestrator.session.gate import StepRefused
from orchestrator.session.sessions import Session
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain

DEPTHS = (1, 10, 100)


def refusal(store: Store, sid: str) -> StepRefused:
    with pytest.raises(StepRefused) as raised:
        gate.admit(store, sid)
    assert raised.value.session_id == sid
    return raised.value


@pytest.fixture(scope="module")
def deep(store: Store) -> list[Session]:
    """A root and 100 nested subagents (index = depth), shared by the tests of this module;
    each test leaves it unarchived."""
    return chain(store, max(DEPTHS))


@pytest.fixture
def archived_deep(store: Store, deep: list[Session]) -> Iterator[list[Session]]:
    archive.archive(store, RecordingDispatcher(), deep[0].session_id)
    yield deep
    archive.unarchive(store, deep[0].session_id)


@pytest.fixture(scope="module")
def dead_store() -> Iterator[Store]:
    """A store on a port where nothing listens, with short timeouts."""
    s = Store("redis://127.0.0.1:1/0", "fleet-test-dead:", socket_timeout=0.2, connect_timeout=0.2)
    yield s
    s.close()


def test_a_normal_session_is_admitted(store: Store, cwd: str) -> None:
    s = sessions.create_session(store, cwd)
    gate.admit(store, s.session_id)  # returns without raising


def test_an_archived_session_is_refused_naming_itself(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    archive.archive(store, recorder, s.session_id)

    refused = refusal(store, s.session_id)

    assert (refused.reason, refused.holder) == ("archived", s.session_id)
    assert "archived" in str(refused)


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_descendant_of_an_archived_session_is_refused_at_any_depth(
    store: Store, archived_deep: list[Session], depth: int
) -> None:
    descendant = archived_deep[depth]
    refused = refusal(store, descendant.session_id)
    # The subtree was archived in one transition: the descendant itself is marked.
    assert refused.reason == "archived"
    assert refused.holder == descendant.session_id


def test_every_session_under_an_archived_ancestor_is_itself_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # The gate reads only the session's own entry; this is the invariant that makes that
    # enough. Random lifecycles of a small forest must never break it.
    rng = random.Random(7)
    made: list[str] = [sessions.create_session(store, cwd).session_id for _ in range(3)]
    for _ in range(300):
        op = rng.choice(["child", "child", "archive", "unarchive", "delete"])
        sid = rng.choice(made)
        try:
            if op == "child":
                made.append(sessions.create_session(store, cwd, parent_id=sid).session_id)
            elif op == "archive":
                archive.archive(store, recorder, sid)
            elif op == "unarchive":
                archive.unarchive(store, sid)
            elif rng.random() < 0.2:
                sessions.delete_session(store, sid)
        except (SessionNotFound, AncestorArchived):
            pass
        # One round trip per step for the whole forest (every ancestor is one of ``made``).
        pipe = store.redis.pipeline(transaction=True)
        pipe.smembers(store.keys.archived)
        for s in made:
            pipe.hget(store.keys.session(s), "deleted")
            pipe.lrange(store.keys.lineage(s), 0, -1)
        archived, *rows = pipe.execute()
        live = {s for s, flag in zip(made, rows[::2], strict=True) if flag == "0"}
        for s, lineage in zip(made, rows[1::2], strict=True):
            if s in live and any(a in archived for a in lineage if a in live):
                assert s in archived, (op, s, lineage)


@pytest.mark.parametrize("depth", (0, *DEPTHS))
def test_after_unarchive_the_lineage_is_admitted_again(
    store: Store, recorder: RecordingDispatcher, deep: list[Session], depth: int
) -> None:
    archive.archive(store, recorder, deep[0].session_id)
    refusal(store, deep[depth].session_id)

    assert archive.unarchive(store, deep[0].session_id) == len(deep)

    gate.admit(store, deep[depth].session_id)


def test_a_deleted_session_is_refused_as_deleted(store: Store, cwd: str) -> None:
    s = sessions.create_session(store, cwd)
    sessions.delete_session(store, s.session_id)

    refused = refusal(store, s.session_id)

    assert (refused.reason, refused.holder) == ("deleted", None)


@pytest.mark.parametrize("sid", ["sess_" + "0" * 24, "../x", ""])
def test_an_unknown_session_is_refused_as_missing(store: Store, sid: str) -> None:
    refused = refusal(store, sid)
    assert (refused.reason, refused.holder) == ("missing", None)


def test_the_gate_fails_closed_when_the_store_is_unreachable(dead_store: Store) -> None:
    # When Redis cannot be reached, admit raises StoreUnavailable: it never passes and never
    # turns the outage into an ordinary refusal
    with pytest.raises(StoreUnavailable):
        gate.admit(dead_store, "sess_" + "0" * 24)


def test_a_step_against_an_unreachable_store_raises_and_runs_nothing(
    store: Store, dead_store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a running turn
    s = sessions.create_session(store, cwd)
    tid = turns.start_turn(store, recorder, s.session_id, "say hi")
    mark = len(recorder.sent)
    model = ScriptedModel()
    # When its step runs while Redis is unreachable
    with pytest.raises(StoreUnavailable):
        steps.run_step(dead_store, recorder, model, tools.run_tool, s.session_id, tid, 0)
    # Then nothing ran and nothing was sent; the turn is still running, ready for the retry
    assert recorder.sent[mark:] == []
    assert store.redis.llen(store.keys.model_requests(s.session_id)) == 0
    t = turns.get_turn(store, tid)
    assert t is not None and t.state == turns.TurnState.RUNNING and t.step == 0
