"""An archive or unarchive reaches a session's descendants, and so does its audit entry: each
descendant the transition archived or restored gets the session's entry in its own trail
(``Keys.audit_log``) under the same id, with ``{"ancestorId"}`` as detail, so ``fleet audit
<child>`` shows it; the fleet-wide stream keeps one entry per request."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.archiving import archive, bulk
from orchestrator.session import titles
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain

pytestmark = pytest.mark.redis


def _entry(store: Store, sid: str, action: str) -> dict[str, Any]:
    """The newest entry of ``action`` in the session's own trail."""
    return next(e for e in audit.read(store, sid) if e["action"] == action)


def _fleet_wide(store: Store, sids: set[str]) -> list[dict[str, Any]]:
    """The fleet-wide entries of ``sids``, newest first (other tests may add their own)."""
    return [e for e in audit.read(store, None, 1000) if e["sessionId"] in sids]


def _inherited(entry: dict[str, Any], sid: str) -> dict[str, Any]:
    """What a descendant's trail holds of its ancestor's ``entry``."""
    return {**entry, "sessionId": sid, "detail": {"ancestorId": entry["sessionId"]}}


def test_an_archive_with_stop_activity_is_in_the_trail_of_every_descendant_it_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent, its child and grandchild, the grandchild busy
    parent, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    turns.start_turn(store, recorder, grandchild, "think 600")
    # When the parent is archived with stopActivity
    with audit.acting_as("tester"):
        archive.archive(store, recorder, parent, stop_activity=True)
    # Then each descendant's trail holds the parent's entry: its id, action, outcome, actor and
    # time, and the parent named as its ancestor
    entry = _entry(store, parent, "archive")
    assert (entry["outcome"], entry["actor"]) == ("archived", "tester")
    assert entry["detail"]["archivedCount"] == 3
    assert audit.read(store, child) == [_inherited(entry, child)]
    assert audit.read(store, grandchild) == [_inherited(entry, grandchild)]
    # And the fleet-wide stream has the one entry of the request, the parent's
    assert [(e["id"], e["sessionId"]) for e in _fleet_wide(store, {parent, child, grandchild})] == [
        (e["id"], parent) for e in audit.read(store, parent)
    ]


def test_an_unarchive_is_in_the_trail_of_every_descendant_it_restored(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent archived with its child and grandchild
    parent, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    archive.archive(store, recorder, parent)
    # When the parent is unarchived
    with audit.acting_as("tester"):
        assert archive.unarchive(store, parent) == 3
    # Then each restored descendant's trail holds the parent's unarchive entry, newest first
    entry = _entry(store, parent, "unarchive")
    assert (entry["outcome"], entry["actor"], entry["detail"]) == (
        "unarchived",
        "tester",
        {"restoredCount": 3},
    )
    for sid in (child, grandchild):
        trail = audit.read(store, sid)
        assert [(e["action"], e["outcome"]) for e in trail] == [
            ("unarchive", "unarchived"),
            ("archive", "archived"),
        ]
        assert trail[0] == _inherited(entry, sid)
        assert entry["at"] == store.redis.hget(store.keys.session(sid), "unarchivedAt")
    # And the fleet-wide stream has one entry per request, both the parent's
    assert [e["sessionId"] for e in _fleet_wide(store, {parent, child, grandchild})] == [
        parent,
        parent,
    ]


def test_a_descendant_archived_on_its_own_is_not_recorded_again_nor_restored(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent, its child and grandchild, the grandchild archived on its own first
    parent, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    archive.archive(store, recorder, grandchild)
    own = audit.read(store, grandchild)
    # When the parent is archived with stopActivity, then unarchived
    archive.archive(store, recorder, parent, stop_activity=True)
    assert archive.unarchive(store, parent) == 2
    # Then the child got both entries, the grandchild neither: its trail is its own archive,
    # and it stays archived
    assert [(e["action"], e["detail"]) for e in audit.read(store, child)] == [
        ("unarchive", {"ancestorId": parent}),
        ("archive", {"ancestorId": parent}),
    ]
    assert audit.read(store, grandchild) == own
    assert store.redis.hget(store.keys.session(grandchild), "archived") == "1"


def test_a_bulk_archive_is_in_the_trail_of_every_descendant_its_transitions_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent with a child and grandchild, and the child named after the parent
    parent, child, grandchild = (s.session_id for s in chain(store, 2, cwd))
    # When they are archived in bulk (one batch)
    with audit.acting_as("tester"):
        result = bulk.bulk_archive(store, recorder, session_ids=[parent, child])
    assert [i.outcome for i in result.results] == ["archived", "already_archived"]
    # Then the grandchild's trail holds the parent's entry; the child's, the parent's entry and
    # its own (found archived), each under its own id
    entry = _entry(store, parent, "bulk_archive")
    assert (entry["outcome"], entry["actor"]) == ("archived", "tester")
    assert audit.read(store, grandchild) == [_inherited(entry, grandchild)]
    own, inherited = audit.read(store, child)
    assert inherited == _inherited(entry, child)
    assert (own["action"], own["outcome"]) == ("bulk_archive", "already_archived")
    assert own["id"] != entry["id"]
    # And the fleet-wide stream has one entry per session the request named
    fleet_wide = _fleet_wide(store, {parent, child, grandchild})
    assert [(e["id"], e["sessionId"]) for e in fleet_wide] == [
        (own["id"], child),
        (entry["id"], parent),
    ]


def test_a_descendants_trail_pages_with_before_through_its_ancestors_entries(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a child whose own entries come between its parent's archives and unarchives
    parent, child = (s.session_id for s in chain(store, 1, cwd))
    titles.set_title(store, child, "first")
    archive.archive(store, recorder, parent)
    archive.unarchive(store, parent)
    titles.set_title(store, child, "second")
    archive.archive(store, recorder, parent)
    # When its trail is read whole, and one entry per page
    whole = audit.read(store, child)
    pages: list[dict[str, Any]] = []
    while page := audit.read(store, child, 1, pages[-1]["id"] if pages else None):
        pages += page
    # Then both read each entry once, newest first, the parent's under their ids
    assert [e["action"] for e in whole] == [
        "archive",
        "set_title",
        "unarchive",
        "archive",
        "set_title",
    ]
    assert pages == whole
    parents = [e["id"] for e in audit.read(store, parent)]
    assert [e["id"] for e in whole if e["action"] != "set_title"] == parents
    assert {e["sessionId"] for e in whole} == {child}
