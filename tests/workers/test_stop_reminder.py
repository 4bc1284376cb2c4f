"""Reminders on the real reminder worker: a due reminder starts a turn, unless its session was
archived first (the stop deletes it; if the stop never arrives, it is refused when due)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.turn.turns import get_turn, start_turn
from tests.helpers import wait_for
from tests.workers.support import (
    item_of,
    model_requests,
    reminder_due_ms,
    reminder_state,
    requests_of,
    turns_of,
    wait_log,
    wait_turn_state,
    wait_until_ms,
    worker,
)

pytestmark = pytest.mark.timeout(60)


def start_with_reminder(store: Any, dispatcher: Any, sid: str, seconds: float) -> tuple[str, str]:
    """Run a turn that stores a reminder ``say later`` due in ``seconds``; wait until the turn
    is over. Returns (turn id, reminder id)."""
    tid = start_turn(store, dispatcher, sid, f"remind {seconds} say later")
    wait_turn_state(store, tid, "completed")
    return tid, item_of(store, sid, "reminder").id


def test_a_due_reminder_of_an_unarchived_session_starts_a_turn(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session whose turn stored a reminder due in half a second
    sid = sessions.new()
    tid, rid = start_with_reminder(store, dispatcher, sid, 0.5)

    # When it comes due
    wait_for(lambda: len(turns_of(store, sid)) == 2, 15, message="the reminder's turn")

    # Then its turn runs like any other and the reminder is spent
    fired = turns_of(store, sid)[1]
    wait_turn_state(store, fired, "completed")
    turn = get_turn(store, fired)
    assert turn is not None
    assert (turn.source, turn.prompt) == ("reminder", "say later")
    assert requests_of(store, sid, fired) == [0]
    assert reminder_state(store, rid) == "fired"


def test_a_reminder_of_a_session_archived_before_it_was_due_never_runs(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session with a reminder due in 2 s, and a control session whose reminder is
    # due half a second later
    sid = sessions.new()
    tid, rid = start_with_reminder(store, dispatcher, sid, 2)
    due_ms = reminder_due_ms(store, rid)
    control = sessions.new()
    start_with_reminder(store, dispatcher, control, 2.5)

    # When the session is archived with stop_activity before the reminder is due
    result = archive(store, dispatcher, sid, stop_activity=True)

    # Then the reminder is deleted
    assert result.stop_report.sent == {"reminder": 1}
    wait_for(lambda: reminder_state(store, rid) == "deleted", 15, message="reminder deleted")

    # And once the control's reminder has fired (so this one's due time has passed too), the
    # archived session has started no turn and made no model request
    wait_for(lambda: len(turns_of(store, control)) == 2, 15, message="the control reminder")
    wait_until_ms(due_ms)
    assert turns_of(store, sid) == [tid]
    assert requests_of(store, sid, tid) == [0]
    assert len(model_requests(store, sid)) == 1


class FailingDispatcher:
    """The real dispatcher, except that sending ``task`` fails like a broker outage."""

    def __init__(self, inner: Any, task: str) -> None:
        self.inner = inner
        self.task = task

    def send(self, task: str, args: list[Any], queue: str) -> None:
        if task == self.task:
            raise ConnectionError(f"broker unreachable for {task}")
        self.inner.send(task, args, queue)


def test_a_reminder_whose_stop_never_arrived_is_refused_when_it_falls_due_and_runs_nothing(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a session with a reminder due in 1 s
    sid = sessions.new()
    tid, rid = start_with_reminder(store, dispatcher, sid, 1)

    # When it is archived with stop_activity but the reminder stop cannot be sent
    result = archive(store, FailingDispatcher(dispatcher, "reminder.stop"), sid, stop_activity=True)

    # Then the archive stands and reports the failed dispatch
    assert result.outcome == "archived"
    assert [family for family, _ in result.stop_report.failed] == ["reminder"]
    assert reminder_state(store, rid) == "armed"
    updated = store.redis.hget(store.keys.session(sid), "updatedAt")
    length = store.redis.llen(store.keys.history(sid))

    # And when the reminder comes due it is refused: no turn, no model request, and the
    # conversation and updatedAt stay as the archive left them
    wait_for(lambda: reminder_state(store, rid) == "refused", 15, message="the refusal")
    assert turns_of(store, sid) == [tid]
    assert requests_of(store, sid, tid) == [0] and len(model_requests(store, sid)) == 1
    assert store.redis.hget(store.keys.session(sid), "updatedAt") == updated
    assert store.redis.llen(store.keys.history(sid)) == length
    wait_log(worker(fleet, "reminder"), f"reminder {rid} not fired")
