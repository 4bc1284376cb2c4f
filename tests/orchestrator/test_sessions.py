"""Sessions: create, read, delete, lineage."""

from __future__ import annotations

import pytest

from orchestrator.errors import InvalidParams, SessionNotFound
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from tests.orchestrator.support import chain

UNKNOWN = "sess_" + "0" * 24


def test_a_session_is_created_in_its_absolute_cwd_unarchived_and_undeleted(
    store: Store, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)

    assert s.session_id.startswith("sess_")
    assert s.cwd == cwd
    assert s.parent_id is None
    assert not s.archived and s.archived_at is None and not s.deleted
    assert s.updated_at == s.created_at
    assert sessions.get_session(store, s.session_id) == s


def test_session_info_has_the_acp_fields_and_a_boolean_archived(store: Store, cwd: str) -> None:
    root, child = chain(store, 1, cwd)

    info = child.to_info()

    assert info["sessionId"] == child.session_id
    assert info["cwd"] == cwd
    assert info["updatedAt"] == child.updated_at
    assert info["archived"] is False
    assert "title" not in info  # no title yet: omitted, not empty
    assert info["_meta"]["agentFleet"]["parentId"] == root.session_id
    assert info["_meta"]["agentFleet"]["createdAt"] == child.created_at


@pytest.mark.parametrize(
    "bad_cwd",
    ["relative/path", "", "./here", "~/home", "C:\\work", None, 5, "/a\x00b", "/" + "a" * 5000],
)
def test_a_cwd_that_is_not_an_absolute_path_is_refused_as_invalid_params(
    store: Store, bad_cwd: object
) -> None:
    with pytest.raises(InvalidParams):
        sessions.create_session(store, bad_cwd)  # type: ignore[arg-type]


@pytest.mark.parametrize("parent", [UNKNOWN, "../x", "a*b"])
def test_creating_under_an_unknown_or_malformed_parent_raises_session_not_found(
    store: Store, cwd: str, parent: str
) -> None:
    with pytest.raises(SessionNotFound):
        sessions.create_session(store, cwd, parent_id=parent)


def test_creating_under_a_deleted_parent_raises_session_not_found(store: Store, cwd: str) -> None:
    # Given a deleted session
    parent = sessions.create_session(store, cwd)
    assert sessions.delete_session(store, parent.session_id)
    # When a subagent is created under it
    # Then it is refused and nothing is attached to the parent
    with pytest.raises(SessionNotFound):
        sessions.create_session(store, cwd, parent_id=parent.session_id)
    assert sessions.descendants(store, parent.session_id) == []


@pytest.mark.parametrize(
    "bad_id", [UNKNOWN, "../x", "a*b", "x" * 200, "", "a b", "a:b", "sess_?", "sess_[ab]"]
)
def test_getting_an_unknown_or_malformed_id_raises_session_not_found(
    store: Store, bad_id: str
) -> None:
    with pytest.raises(SessionNotFound):
        sessions.get_session(store, bad_id)


@pytest.mark.parametrize("bad_id", [None, 5, ["sess_x"]])
def test_getting_a_non_string_id_raises_invalid_params(store: Store, bad_id: object) -> None:
    with pytest.raises(InvalidParams):
        sessions.get_session(store, bad_id)  # type: ignore[arg-type]


def test_an_id_with_a_trailing_newline_is_malformed() -> None:
    with pytest.raises(SessionNotFound):
        sessions.check_session_id("sess_abc\n")


def test_a_deleted_session_is_not_found_but_kept_for_include_deleted(
    store: Store, cwd: str
) -> None:
    # Given a session
    s = sessions.create_session(store, cwd)
    # When it is deleted
    assert sessions.delete_session(store, s.session_id) is True
    # Then reading it raises SessionNotFound, and only include_deleted still sees the record
    with pytest.raises(SessionNotFound):
        sessions.get_session(store, s.session_id)
    assert sessions.get_session(store, s.session_id, include_deleted=True).deleted


def test_deleting_is_idempotent_and_silent_for_unknown_or_malformed_ids(
    store: Store, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)

    assert sessions.delete_session(store, s.session_id) is True
    assert sessions.delete_session(store, s.session_id) is False
    assert sessions.delete_session(store, UNKNOWN) is False
    assert sessions.delete_session(store, "../x") is False


def test_the_lineage_of_a_depth_three_subagent_is_stored_nearest_first(store: Store) -> None:
    # Given root -> child -> grandchild -> great-grandchild
    root, child, grandchild, great = chain(store, 3)

    # Then each session's stored lineage lists its ancestors nearest first
    def lineage(s: sessions.Session) -> list[str]:
        found: list[str] = store.redis.lrange(store.keys.lineage(s.session_id), 0, -1)
        return found

    assert lineage(root) == []
    assert lineage(child) == [root.session_id]
    assert lineage(grandchild) == [child.session_id, root.session_id]
    assert lineage(great) == [grandchild.session_id, child.session_id, root.session_id]
    # And each one names its direct parent
    assert great.parent_id == grandchild.session_id
    assert store.redis.smembers(store.keys.children(child.session_id)) == {grandchild.session_id}


def test_descendants_are_listed_at_every_depth_breadth_first(store: Store, cwd: str) -> None:
    # Given a root with two children, one of which has a child of its own
    root = sessions.create_session(store, cwd)
    a = sessions.create_session(store, cwd, parent_id=root.session_id)
    b = sessions.create_session(store, cwd, parent_id=root.session_id)
    a1 = sessions.create_session(store, cwd, parent_id=a.session_id)

    found = sessions.descendants(store, root.session_id)

    assert sorted(found[:2]) == sorted([a.session_id, b.session_id])
    assert found[2:] == [a1.session_id]
    assert sessions.descendants(store, a1.session_id) == []
