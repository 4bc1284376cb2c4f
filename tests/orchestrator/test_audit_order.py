"""Archives and unarchives of one lineage racing from several threads leave trails that replay:
read in order, each entry's outcome is what the session's state then allows, and entry times
never go back. An unarchive's no-op (``not_archived``) and refusal (``refused`` under an
archived ancestor) are written by its script with the answer, at the script's time, so no
archive committed in between comes first in the trail and no ``at`` is older than the entry
before it."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from orchestrator.archiving import archive
from orchestrator.errors import AncestorArchived
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain

pytestmark = pytest.mark.redis

ROUNDS = 150


def _trail(store: Store, sid: str) -> list[dict[str, Any]]:
    """The session's whole trail, oldest first."""
    entries: list[dict[str, Any]] = []
    before = None
    while True:
        page = audit.read(store, sid, count=audit.MAX_READ, before=before)
        entries += page
        if len(page) < audit.MAX_READ:
            return entries[::-1]
        before = page[-1]["id"]


def _replay(trail: list[dict[str, Any]], root: str) -> list[str]:
    """What in ``trail`` its session's state at that point does not allow (empty when it all
    replays). A descendant is archived and restored by its ancestor's entries."""
    archived, wrong = False, []
    for entry in trail:
        step = (entry["action"], entry["outcome"])
        allowed = {
            ("archive", "archived"): not archived,
            ("archive", "already_archived"): archived,
            ("unarchive", "unarchived"): archived,
            ("unarchive", "not_archived"): not archived,
            ("unarchive", "refused"): archived and entry["detail"].get("archivedAncestor") == root,
        }
        if not allowed.get(step, False):
            wrong.append(f"{entry['id']} {step} while archived={archived}")
        if step == ("archive", "archived"):
            archived = True
        elif step == ("unarchive", "unarchived"):
            archived = False
    return wrong


def test_racing_archives_and_unarchives_leave_trails_that_replay_in_order(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with a subagent
    root, child = (s.session_id for s in chain(store, 1, cwd))
    failures: list[BaseException] = []

    def hammer(act: Any, sid: str) -> None:
        try:
            for _ in range(ROUNDS):
                with contextlib.suppress(AncestorArchived):
                    act(sid)
        except BaseException as exc:  # the test reports it
            failures.append(exc)

    def archive_it(sid: str) -> None:
        archive.archive(store, recorder, sid)

    def unarchive_it(sid: str) -> None:
        archive.unarchive(store, sid)

    # When two threads archive the root, two unarchive it and one unarchives the child
    threads = [
        threading.Thread(target=hammer, args=(archive_it, root)),
        threading.Thread(target=hammer, args=(archive_it, root)),
        threading.Thread(target=hammer, args=(unarchive_it, root)),
        threading.Thread(target=hammer, args=(unarchive_it, root)),
        threading.Thread(target=hammer, args=(unarchive_it, child)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    # Then each trail replays: every outcome is one its session's state allowed at that point
    root_trail, child_trail = _trail(store, root), _trail(store, child)
    assert len(root_trail) == 4 * ROUNDS
    assert _replay(root_trail, root) == []
    assert _replay(child_trail, root) == []
    assert any(e["outcome"] == "refused" for e in child_trail)
    assert any(e["outcome"] == "not_archived" for e in child_trail)
    # And entry times follow entry ids
    for trail in (root_trail, child_trail):
        times = [e["at"] for e in trail]
        assert times == sorted(times)
