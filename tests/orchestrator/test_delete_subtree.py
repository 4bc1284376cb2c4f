"""A delete takes the session's whole subtree: every descendant, any depth, is deleted in the
same checked script as the session, leaves every listing and index the create path put it in,
and gets the delete's audit entry in its own trail (``{"ancestorId"}``); the session leaves
its parent's children set, so the parent no longer walks or counts it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.archiving import archive, deletion
from orchestrator.errors import LimitReached, SessionActive, SessionNotFound
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.session.sessions import Session
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, deleted_leftovers
from tests.orchestrator.support import chain

pytestmark = pytest.mark.redis

FILTERS = ("exclude", "include", "only")


def listed(store: Store, cwd: str) -> set[str]:
    """Every session listed in ``cwd`` under any archived filter."""
    return {
        s.session_id
        for flt in FILTERS
        for s in sessions.list_sessions(store, cwd=cwd, archived=flt, limit=100).sessions
    }


def tree(store: Store, cwd: str) -> dict[str, Session]:
    """root -> a -> a1 -> a11 (depth 3) and root -> b, b archived on its own."""
    root, a, a1, a11 = chain(store, 3, cwd)
    b = sessions.create_session(store, cwd, root.session_id)
    return {"root": root, "a": a, "a1": a1, "a11": a11, "b": b}


def gone(store: Store, sid: str) -> None:
    with pytest.raises(SessionNotFound):
        sessions.get_session(store, sid)
    assert sessions.get_session(store, sid, include_deleted=True).deleted


def delete_entry(store: Store, sid: str) -> dict[str, Any]:
    return next(e for e in audit.read(store, sid) if e["action"] == "delete")


@pytest.mark.parametrize("stop_activity", (False, True))
def test_deleting_an_idle_root_deletes_its_whole_subtree_and_leaves_nothing_behind(
    store: Store, recorder: RecordingDispatcher, cwd: str, stop_activity: bool
) -> None:
    # Given an idle tree of depth 3 with an archived branch
    s = tree(store, cwd)
    archive.archive(store, recorder, s["b"].session_id)
    ids = {x.session_id for x in s.values()}
    below = ids - {s["root"].session_id}
    assert listed(store, cwd) == ids

    # When the root is deleted
    result = deletion.delete(store, recorder, s["root"].session_id, stop_activity=stop_activity)

    # Then every descendant was deleted with it, and the answer says which
    assert result.deleted and set(result.deleted_descendants) == below
    assert len(result.deleted_descendants) == len(below)
    wire = result.to_wire()
    assert set(wire["deletedDescendants"]) == below
    # none is listed under any filter, each reads as deleted, and no index, set or
    # structural key of theirs is left (exactly what a single delete leaves: the record and
    # the audit trail)
    assert listed(store, cwd) == set()
    for sid in ids:
        gone(store, sid)
    assert deleted_leftovers(store, ids) == []
    # the root's entry counts them, and each descendant's trail holds it
    root_entry = delete_entry(store, s["root"].session_id)
    assert (root_entry["outcome"], root_entry["detail"]) == ("deleted", {"deletedCount": 5})
    for sid in below:
        entry = delete_entry(store, sid)
        assert entry == {
            **root_entry,
            "sessionId": sid,
            "detail": {"ancestorId": s["root"].session_id},
        }
    fleet_wide = [e for e in audit.read(store, None, 1000) if e["id"] == root_entry["id"]]
    assert [e["sessionId"] for e in fleet_wide] == [s["root"].session_id]
    # and a second delete finds nothing
    assert not deletion.delete(store, recorder, s["root"].session_id).deleted


def test_a_delete_is_refused_while_a_grandchild_has_live_work_naming_its_item(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild, the grandchild alone with live work (a reminder)
    root, child, grandchild = chain(store, 2, cwd)
    rid = reminders.create_reminder(store, grandchild.session_id, 600, "later")

    # When the root is deleted, Then it is refused naming the grandchild and its reminder
    with pytest.raises(SessionActive) as refused:
        deletion.delete(store, recorder, root.session_id)
    [item] = refused.value.items
    assert (item.family, item.id) == ("subagent", grandchild.session_id)
    assert [(p.family, p.id) for p in item.parts] == [("reminder", rid)]
    # and nothing was deleted: the whole tree is still there and still linked
    assert listed(store, cwd) == {root.session_id, child.session_id, grandchild.session_id}
    assert sessions.descendants(store, root.session_id) == [
        child.session_id,
        grandchild.session_id,
    ]
    assert delete_entry(store, root.session_id)["outcome"] == "refused"
    # (a refusal is recorded in the root's trail alone)
    assert all(e["action"] != "delete" for e in audit.read(store, grandchild.session_id))


def test_deleting_a_middle_node_deletes_only_its_subtree(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> a -> a1 -> a11 and root -> b
    s = tree(store, cwd)
    mid = s["a"].session_id
    subtree = {mid, s["a1"].session_id, s["a11"].session_id}

    # When the middle node is deleted
    result = deletion.delete(store, recorder, mid)

    # Then its subtree is gone and nothing else
    assert result.deleted
    assert result.deleted_descendants == [s["a1"].session_id, s["a11"].session_id]
    assert listed(store, cwd) == {s["root"].session_id, s["b"].session_id}
    for sid in subtree:
        gone(store, sid)
    assert deleted_leftovers(store, subtree) == []
    # and the root no longer lists it as a child
    root = s["root"].session_id
    assert store.redis.smembers(store.keys.children(root)) == {s["b"].session_id}
    assert sessions.descendants(store, root) == [s["b"].session_id]
    assert delete_entry(store, s["a11"].session_id)["detail"] == {"ancestorId": mid}


def test_a_child_deleted_without_a_check_leaves_its_parents_subagent_count(
    store_with: Callable[..., Store], cwd: str
) -> None:
    # Given a cap of one live subagent and a parent whose one child has live work
    store = store_with(max_subagents_per_session=1)
    parent = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent).session_id
    reminders.create_reminder(store, child, 600, "later")
    with pytest.raises(LimitReached):
        sessions.create_session(store, cwd, parent)

    # When the child is deleted directly (the unchecked delete)
    assert sessions.delete_session(store, child)

    # Then the parent no longer holds or counts it: the next subagent is allowed
    assert store.redis.smembers(store.keys.children(parent)) == set()
    spawned = sessions.create_session(store, cwd, parent).session_id
    assert store.redis.smembers(store.keys.children(parent)) == {spawned}
