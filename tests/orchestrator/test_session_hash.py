"""The stored session hash: the id is its key's suffix, not a field, and every read names the
session by it."""

from __future__ import annotations

from orchestrator.archiving import archive
from orchestrator.session import sessions, titles
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain, unique_cwd


def _listed(store: Store, **params: object) -> list[str]:
    return [s.session_id for s in sessions.list_sessions(store, limit=100, **params).sessions]


def test_a_new_session_hash_holds_no_session_id_field(store: Store) -> None:
    root, child = chain(store, 1)

    for s in (root, child):
        h = store.redis.hgetall(store.keys.session(s.session_id))
        assert h["cwd"] == root.cwd  # the hash is there...
        assert "sessionId" not in h  # ...without the id its key name already holds


def test_every_read_of_a_new_session_returns_its_id(store: Store) -> None:
    # Given an active session and an archived one with a title, in one cwd
    cwd = unique_cwd()
    active, gone = (sessions.create_session(store, cwd) for _ in range(2))
    titles.set_title(store, gone.session_id, "findable title")
    archive.archive(store, RecordingDispatcher(), gone.session_id)

    # Then each read names each session by its id
    assert sessions.get_session(store, active.session_id).session_id == active.session_id
    assert sessions.get_session(store, gone.session_id).session_id == gone.session_id
    assert _listed(store, cwd=cwd) == [active.session_id]
    assert _listed(store, cwd=cwd, archived="only") == [gone.session_id]
    assert set(_listed(store, cwd=cwd, archived="include")) == {gone.session_id, active.session_id}
    assert _listed(store, cwd=cwd, archived="include", q="findable") == [gone.session_id]
    assert gone.session_id in _listed(store, archived="only")
