"""Bulk archive with stopActivity on real worker processes: twenty busy sessions (jobs on two
hosts, reminders, subagents, turns mid-step) are archived in two batches with one stop message
per family per batch (``*.stop_many``), and every family drains by itself."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from orchestrator.archiving import bulk
from orchestrator.census.activity import census
from orchestrator.families import Task
from orchestrator.session.sessions import get_session
from orchestrator.turn.turns import start_turn
from tests.helpers import wait_for
from tests.workers.support import (
    item_of,
    reminder_state,
    turn_state,
    wait_families,
    wait_gone,
    wait_job_pid,
    wait_request,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]

#: A job and a reminder outlive the turn that made them.
JOB_AND_REMINDER = "run 63.1\nremind 120 say wake"
#: ... plus a subagent whose own turn stores a reminder.
WITH_SUBAGENT = "spawn remind 120 say child|say stored\nrun 63.1\nremind 120 say wake"
#: ... plus the turn itself still thinking (a step in flight).
THINKING = "run 63.1\nremind 120 say wake\nthink 60"


class Counting:
    """Sends through the real dispatcher and records what it sent."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent: list[tuple[str, list[Any], str]] = []

    def send(self, task: str, args: list[Any], queue: str) -> None:
        self.sent.append((task, args, queue))
        self.inner.send(task, args, queue)


def test_bulk_archive_with_stop_drains_twenty_busy_sessions(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given twenty busy sessions: every one has a running job and an armed reminder; four
    # also have a subagent with a reminder of its own; three have a turn thinking
    plan = [WITH_SUBAGENT] * 4 + [THINKING] * 3 + [JOB_AND_REMINDER] * 13
    busy: list[dict[str, Any]] = []
    for prompt in plan:
        sid = sessions.new()
        tid = start_turn(store, dispatcher, sid, prompt)
        busy.append({"sid": sid, "tid": tid, "prompt": prompt})
    for b in busy:
        expected = {"job", "reminder"} | ({"subagent"} if b["prompt"] == WITH_SUBAGENT else set())
        if b["prompt"] == THINKING:
            expected.add("turn")
            wait_request(store, b["sid"], b["tid"], 2, timeout=30)
        wait_families(store, b["sid"], expected, timeout=30)
        b["jid"] = item_of(store, b["sid"], "job").id
        b["pid"] = wait_job_pid(store, b["jid"])
        b["rid"] = item_of(store, b["sid"], "reminder").id
    hosts = {store.redis.hget(store.keys.job(b["jid"]), "host") for b in busy}
    assert hosts <= {"test-1", "test-2"}

    # When they are archived in bulk with stopActivity, ten per batch
    counting = Counting(dispatcher)
    result = bulk.bulk_archive(
        store, counting, session_ids=[b["sid"] for b in busy], stop_activity=True, batch_size=10
    )

    # Then all twenty are archived at once, in two batches
    assert result.totals["archived"] == 20 and result.batches == 2
    assert all(get_session(store, b["sid"]).archived for b in busy)
    # And at most one stop message per family per batch was sent (jobs: per host), none of
    # them the single-session kind
    by_kind = Counter((task, queue) for task, _, queue in counting.sent)
    assert all(task.endswith(".stop_many") for task, _ in by_kind), by_kind
    assert all(n <= 2 for n in by_kind.values()), by_kind
    assert by_kind[(Task.REMINDER_STOP_MANY, "reminder.ctl")] == 2
    assert by_kind[(Task.TURN_STOP_MANY, "turn.ctl")] >= 1
    assert by_kind[(Task.SUBAGENT_STOP_MANY, "subagent.ctl")] >= 1
    assert sum(n for (task, _), n in by_kind.items() if task == Task.JOB_STOP_MANY) <= 4
    assert result.stop_report.failed == []
    assert result.stop_report.sent["job"] == 20 and result.stop_report.sent["reminder"] == 20

    # And every family drains: no census item left, job processes gone, reminders deleted,
    # the thinking turns cancelled
    wait_for(
        lambda: not any(census(store, b["sid"]) for b in busy),
        60,
        message="all twenty sessions to drain",
    )
    for b in busy:
        wait_gone(b["pid"])
        assert reminder_state(store, b["rid"]) == "deleted"
        if b["prompt"] == THINKING:
            assert turn_state(store, b["tid"]) == "cancelled"


@pytest.mark.parametrize("threads", [1, 4])
def test_one_failing_session_never_keeps_the_others_of_a_batch_running(threads: int) -> None:
    from workers.bulk import each_session

    stopped: list[str] = []

    def stop_one(sid: str, ids: list[str] | None = None) -> dict[str, Any]:
        if sid == "bad":
            raise RuntimeError("boom")
        stopped.append(sid)
        return {"sessionId": sid, "items": ids}

    out = each_session(
        {"a": ["1"], "bad": ["2"], "c": ["3", "4"]}, stop_one, "job", threads=threads
    )
    assert out == {
        "a": {"items": ["1"]},
        "bad": "error: RuntimeError: boom",
        "c": {"items": ["3", "4"]},
    }
    assert sorted(stopped) == ["a", "c"]
    # Reminders carry no ids: the single stop takes the session alone
    assert each_session({"r": None}, stop_one, "reminder") == {"r": {"items": None}}
    assert each_session(["not", "a", "mapping"], stop_one, "turn") == {}  # type: ignore[arg-type]


def test_the_bulk_stop_tasks_are_registered_by_name() -> None:
    from orchestrator.settings import FleetSettings
    from workers.app import create_app

    app = create_app(FleetSettings())
    app.loader.import_default_modules()
    for name in (
        Task.TURN_STOP_MANY,
        Task.JOB_STOP_MANY,
        Task.SUBAGENT_STOP_MANY,
        Task.REMINDER_STOP_MANY,
    ):
        assert name in app.tasks
