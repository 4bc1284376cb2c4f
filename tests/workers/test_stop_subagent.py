"""Stopping subagents on the real subagent worker: every descendant with live work, at any
depth, is stopped the way its parent would stop it (turns, jobs, reminders)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census, own_items
from orchestrator.errors import SessionActive
from orchestrator.turn.turns import start_turn
from tests.helpers import wait_for
from tests.workers.support import (
    item_of,
    job_record,
    reminder_state,
    turns_of,
    wait_drained,
    wait_gone,
    wait_job_pid,
    wait_request,
    wait_turn_state,
)

pytestmark = pytest.mark.timeout(60)


def test_archiving_a_parent_stops_its_subagents_turn_job_and_reminder(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a parent whose finished turn spawned a subagent that started a job, stored a
    # reminder and is now thinking
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, "spawn run 67.3|remind 5 say wake|think 30")
    wait_turn_state(store, tid, "completed")
    child = item_of(store, sid, "subagent").id
    [child_tid] = turns_of(store, child)
    wait_request(store, child, child_tid, 2)
    own = {i.family.value: i for i in own_items(store, child)}
    assert set(own) == {"turn", "job", "reminder"}
    pid = wait_job_pid(store, own["job"].id)

    # When the parent is archived without stop_activity
    with pytest.raises(SessionActive) as refused:
        archive(store, dispatcher, sid)

    # Then it is refused with one subagent item that sums up the child's live work
    [item] = refused.value.items
    assert (item.family.value, item.id) == ("subagent", child)
    assert "1 turn" in item.label and "1 job" in item.label and "1 reminder" in item.label

    # When it is archived with stop_activity
    result = archive(store, dispatcher, sid, stop_activity=True)

    # Then the subagent's turn is cancelled, its job stopped and its reminder deleted
    assert result.stop_report.sent == {"subagent": 1}
    wait_drained(store, sid)
    wait_turn_state(store, child_tid, "cancelled")
    wait_gone(pid)
    assert job_record(store, own["job"].id)["state"] == "stopped"
    assert reminder_state(store, own["reminder"].id) == "deleted"

    # And the parent is not woken by its stopped child
    assert turns_of(store, sid) == [tid]


def test_archiving_a_parent_stops_a_grandchild_with_live_work(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a parent whose child spawned a grandchild that is thinking; the child finished
    # (and woke the parent, whose report turn finished too)
    sid = sessions.new()
    start_turn(store, dispatcher, sid, "spawn spawn think 30")
    wait_for(
        lambda: (
            [i.family.value for i in census(store, sid)] == ["subagent"]
            and len(turns_of(store, sid)) == 2
            and not own_items(store, sid)
        ),
        15,
        message="only the grandchild to be live",
    )
    [item] = census(store, sid)
    grandchild = item.id
    [child] = store.redis.smembers(store.keys.children(sid))
    assert store.redis.smembers(store.keys.children(child)) == {grandchild}
    [grand_tid] = turns_of(store, grandchild)
    wait_request(store, grandchild, grand_tid, 0)

    # When the parent is archived with stop_activity
    archive(store, dispatcher, sid, stop_activity=True)

    # Then the grandchild's turn is cancelled and the whole subtree drains
    wait_turn_state(store, grand_tid, "cancelled")
    wait_drained(store, sid)
