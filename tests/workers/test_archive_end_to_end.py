"""Archive of a session busy in all four families, end to end on real worker processes.

The session's turn spawns a subagent, starts a background job, stores a reminder and then
thinks; archive must refuse it (listing every live thing), and with ``stop_activity`` archive at
once, return without waiting for the stops, and every family must then drain by itself.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.errors import SessionActive
from orchestrator.reminder import reminders
from orchestrator.session.sessions import get_session
from orchestrator.turn.turns import start_turn
from tests.helpers import wait_for
from tests.workers.support import (
    ALL_FAMILIES,
    item_of,
    job_record,
    log_text,
    model_requests,
    paused_consumer,
    reminder_due_ms,
    reminder_state,
    stop_takers,
    turns_of,
    wait_drained,
    wait_families,
    wait_gone,
    wait_job_pid,
    wait_log_of_any,
    wait_request,
    wait_turn_state,
    wait_until_ms,
    worker,
)

pytestmark = pytest.mark.timeout(90)

#: Step 0 spawns a subagent that thinks, step 1 starts a job, step 2 stores a reminder, step 3
#: thinks. The reminder is due soon enough to check that it never fires.
BUSY = "spawn think 30|say done\nrun {job}\nremind {due} say wake\nthink 60"


def start_busy_session(
    store: Any, dispatcher: Any, sessions: Any, job: str, due: float = 5
) -> dict[str, Any]:
    """A session whose turn is thinking (step 3 in flight) while its subagent thinks (its step
    in flight), its job runs and its reminder is armed. Returns the ids involved."""
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, BUSY.format(job=job, due=due))
    wait_families(store, sid, set(ALL_FAMILIES))
    # Both turns have a model request in flight, so a stop finds them mid-step (not between
    # steps, where the gate would end them "blocked" instead of "cancelled").
    wait_request(store, sid, tid, 3)
    child = item_of(store, sid, "subagent").id
    [child_tid] = turns_of(store, child)
    wait_request(store, child, child_tid, 0)
    jid = item_of(store, sid, "job").id
    return {
        "sid": sid,
        "tid": tid,
        "child": child,
        "child_tid": child_tid,
        "jid": jid,
        "pid": wait_job_pid(store, jid),
        "rid": item_of(store, sid, "reminder").id,
    }


def test_a_session_busy_in_all_four_families_is_refused_then_stopped_and_every_family_drains(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session with a running turn, a running job, an armed reminder and a subagent
    # whose own turn runs
    busy = start_busy_session(store, dispatcher, sessions, job="61.3")
    sid = busy["sid"]
    due_ms = reminder_due_ms(store, busy["rid"])

    # When it is archived without stop_activity
    with pytest.raises(SessionActive) as refused:
        archive(store, dispatcher, sid)

    # Then the archive is refused with one item per live thing, and nothing was archived
    assert sorted((i.family.value, i.id) for i in refused.value.items) == sorted(
        [
            ("turn", busy["tid"]),
            ("job", busy["jid"]),
            ("reminder", busy["rid"]),
            ("subagent", busy["child"]),
        ]
    )
    assert refused.value.data["activity"] == [i.to_wire() for i in refused.value.items]
    assert not get_session(store, sid).archived
    assert not get_session(store, busy["child"]).archived

    # When it is archived with stop_activity
    result = archive(store, dispatcher, sid, stop_activity=True)
    # The stops are requests, not waited for (the next test holds one back in its queue); the
    # turns were stopped by the archive's own script and their steps notice within 50 ms.
    requests_at_archive = len(model_requests(store, sid)) + len(
        model_requests(store, busy["child"])
    )

    # Then the archive stands at once, for the whole subtree, with one stop sent per family
    assert result.outcome == "archived"
    assert result.archived_count == 2
    assert get_session(store, sid).archived
    assert get_session(store, busy["child"]).archived
    assert result.stop_report.sent == {"turn": 1, "job": 1, "subagent": 1, "reminder": 1}
    assert result.stop_report.failed == []
    assert {i.family.value for i in result.stopped} == set(ALL_FAMILIES)

    # And every family drains
    wait_drained(store, sid)
    wait_turn_state(store, busy["tid"], "cancelled")
    wait_turn_state(store, busy["child_tid"], "cancelled")
    wait_gone(busy["pid"])
    assert job_record(store, busy["jid"])["state"] == "stopped"
    assert reminder_state(store, busy["rid"]) == "deleted"
    assert store.redis.zscore(store.keys.reminders_due, busy["rid"]) is None

    # And the reminder never fires: a control reminder of another session, due half a second
    # after it (five poller ticks), fires, while the archived session starts no turn and makes
    # no model request
    control = sessions.new()
    reminders.create_reminder(store, control, max(0.0, due_ms / 1000 - time.time()) + 0.5, "say ok")
    wait_for(lambda: turns_of(store, control), 15, message="the control reminder to fire")
    wait_until_ms(due_ms)
    assert turns_of(store, sid) == [busy["tid"]]
    assert turns_of(store, busy["child"]) == [busy["child_tid"]]
    requests_now = len(model_requests(store, sid)) + len(model_requests(store, busy["child"]))
    assert requests_now == requests_at_archive


def test_archive_returns_while_a_stop_still_waits_in_its_queue_and_the_others_do_not_wait(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session busy in all four families, and the subagent worker paused, so a
    # subagent stop can only wait in its queue
    busy = start_busy_session(store, dispatcher, sessions, job="62.3", due=30)
    sid = busy["sid"]
    node = f"subagent@{worker(fleet, 'subagent').host}"
    with paused_consumer(dispatcher.app, node, "subagent.ctl"):
        # When it is archived with stop_activity
        result = archive(store, dispatcher, sid, stop_activity=True)

        # Then archive returned although the subagent stop cannot have run yet
        assert result.outcome == "archived"
        assert result.stop_report.sent["subagent"] == 1

        # And the families drain without waiting for it: the archive stopped the subagent's
        # turn in its own script, which its step saw through the store
        wait_turn_state(store, busy["tid"], "cancelled")
        wait_turn_state(store, busy["child_tid"], "cancelled")
        wait_gone(busy["pid"])
        wait_for(
            lambda: reminder_state(store, busy["rid"]) == "deleted",
            message=f"reminder {busy['rid']} to be deleted by its stop",
        )
        wait_drained(store, sid)


class CorruptingDispatcher:
    """Sends through the real Celery app, but with broken arguments for one task, so its
    handler raises in the worker; remembers the Celery ids of the corrupted messages."""

    def __init__(self, inner: Any, task: str) -> None:
        self.inner = inner
        self.task = task
        self.corrupted: list[str] = []

    def send(self, task: str, args: list[Any], queue: str) -> None:
        if task != self.task:
            self.inner.send(task, args, queue)
            return
        sent = self.inner.app.send_task(
            task, args=[args[0], 42], queue=queue, routing_key=queue, retry=False
        )
        self.corrupted.append(sent.id)


def test_a_stop_handler_that_raises_is_logged_and_the_other_families_still_stop(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session busy in all four families whose turn is in a short think, followed by
    # one more step
    sid = sessions.new()
    tid = start_turn(
        store,
        dispatcher,
        sid,
        "spawn think 30|say done\nrun 63.3\nremind 5 say wake\nthink 3\nsay after",
    )
    wait_families(store, sid, set(ALL_FAMILIES))
    wait_request(store, sid, tid, 3)
    jid = item_of(store, sid, "job").id
    rid = item_of(store, sid, "reminder").id
    child = item_of(store, sid, "subagent").id
    [child_tid] = turns_of(store, child)
    pid = wait_job_pid(store, jid)

    # When it is archived with stop_activity through a dispatcher that breaks the turn stop
    broken = CorruptingDispatcher(dispatcher, "turn.stop")
    result = archive(store, broken, sid, stop_activity=True)

    # Then the archive stands and the turn stop was sent (the failure is in its handler)
    assert result.outcome == "archived"
    assert get_session(store, sid).archived
    assert result.stop_report.sent == {"turn": 1, "job": 1, "subagent": 1, "reminder": 1}
    [task_id] = broken.corrupted

    # And the turn worker that took the stop (the control-only one, or the turn worker)
    # logs the handler's error
    turn_worker = wait_log_of_any(stop_takers(fleet, "turn"), f"turn.stop[{task_id}] raised")
    line = next(ln for ln in log_text(turn_worker).splitlines() if task_id in ln and "raised" in ln)
    assert "TypeError" in line

    # And the other families still stop
    wait_gone(pid)
    wait_for(lambda: job_record(store, jid)["state"] == "stopped", 15, message="job stopped")
    wait_for(lambda: reminder_state(store, rid) == "deleted", 15, message="reminder deleted")
    wait_turn_state(store, child_tid, "cancelled")

    # And the turn whose stop handler broke is stopped all the same: the archive stopped it in
    # its own script and its step saw that through the store; it runs no further request
    wait_turn_state(store, tid, "cancelled")
    wait_drained(store, sid)
    assert 4 not in [r["step"] for r in model_requests(store, sid) if r["turnId"] == tid]
