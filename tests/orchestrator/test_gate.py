"""The step gate: admits normal sessions, refuses archived lineages, fails closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator import archive, gate, sessions, tools, turns
from orchestrator.errors import StoreUnavailable
from orchestrator.gate import StepRefused
from orchestrator.model import ScriptedModel
from orchestrator.sessions import Session
from orchestrator.store import Store
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
    # The subtree was archived in one transition, so the nearest archived session in the
    # descendant's lineage is the descendant itself.
    assert refused.reason == "archived"
    assert refused.holder == descendant.session_id


@pytest.mark.parametrize("depth", DEPTHS)
def test_the_gate_finds_an_archived_ancestor_through_the_stored_lineage(
    store: Store, deep: list[Session], depth: int
) -> None:
    # Given only the root in the archived set (the gate's lineage walk alone, isolated from
    # the subtree marks an archive writes)
    root = deep[0].session_id
    store.redis.sadd(store.keys.archived, root)
    try:
        # Then a descendant at any depth is refused and the root is named as the holder
        refused = refusal(store, deep[depth].session_id)
        assert (refused.reason, refused.holder) == ("archived", root)
    finally:
        store.redis.srem(store.keys.archived, root)
    gate.admit(store, deep[depth].session_id)


def test_the_nearest_archived_ancestor_is_named(store: Store, deep: list[Session]) -> None:
    # Given two archived ancestors of the deepest session, at depth 0 and depth 50
    marks = [deep[0].session_id, deep[50].session_id]
    store.redis.sadd(store.keys.archived, *marks)
    try:
        assert refusal(store, deep[100].session_id).holder == deep[50].session_id
        assert refusal(store, deep[49].session_id).holder == deep[0].session_id
    finally:
        store.redis.srem(store.keys.archived, *marks)


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
        turns.run_step(dead_store, recorder, model, tools.run_tool, s.session_id, tid, 0)
    # Then nothing ran and nothing was sent; the turn is still running, ready for the retry
    assert recorder.sent[mark:] == []
    assert store.redis.llen(store.keys.model_requests(s.session_id)) == 0
    t = turns.get_turn(store, tid)
    assert t is not None and t.state == turns.TurnState.RUNNING and t.step == 0
