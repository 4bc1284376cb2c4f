"""The ``FLEET_MAX_*`` limits at their boundary: N allowed, N+1 refused with a message naming
the limit and the current count (nothing stored), allowed again once one ends.

No worker process runs here; ``tests/workers/test_limits_in_workers.py`` drives a turn of real
workers over the per-session job cap.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from orchestrator.errors import LimitReached
from orchestrator.job import jobs
from orchestrator.job import scripts as job_scripts
from orchestrator.job.jobs import JobState
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store, iso, now_ms
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain, claim_job


@pytest.fixture
def store(store_with: Callable[..., Store]) -> Store:
    """This module's store: the run's settings, its own copy, which ``limit`` changes."""
    return store_with()


@pytest.fixture
def limit(store: Store) -> Callable[[str, int], None]:
    """Sets one ``FLEET_MAX_*`` limit in the settings of this test's store."""

    def set_limit(name: str, value: int) -> None:
        setattr(store.settings, name.removeprefix("FLEET_").lower(), value)

    return set_limit


def end_job(store: Store, jid: str) -> None:
    """End a job as its worker would when the process exits."""
    ended = job_scripts.job_end(
        store,
        job_id=jid,
        state=JobState.EXITED,
        exit_code="0",
        now_iso=iso(now_ms()),
        allowed_from=(JobState.STARTING, JobState.RUNNING),
    )
    assert ended == "ok"


def refused(call: Callable[[], object]) -> str:
    """The message of the ``LimitReached`` that ``call`` raises."""
    with pytest.raises(LimitReached) as caught:
        call()
    return caught.value.message


def test_the_defaults_are_the_documented_safe_values() -> None:
    # The field defaults, not the test environment's (which deepens the subagent limit).
    defaults = {name: field.default for name, field in FleetSettings.model_fields.items()}
    assert (
        defaults["max_jobs_per_session"],
        defaults["max_jobs_per_host"],
        defaults["max_reminders_per_session"],
        defaults["max_subagent_depth"],
        defaults["max_subagents_per_session"],
    ) == (16, 64, 100, 5, 32)


def test_a_session_may_have_n_live_jobs_the_next_is_refused_until_one_ends(
    store: Store, recorder: RecordingDispatcher, cwd: str, limit: Callable[[str, int], None]
) -> None:
    # Given a per-session cap of 3 and a session with 3 live jobs
    limit("FLEET_MAX_JOBS_PER_SESSION", 3)
    sid = sessions.create_session(store, cwd).session_id
    started = [jobs.create_job(store, recorder, sid, 30, "sleep 30s") for _ in range(3)]

    # When a fourth is asked for, Then it is refused naming the limit and the count, and
    # nothing is stored or sent
    message = refused(lambda: jobs.create_job(store, recorder, sid, 30, "sleep 30s"))
    assert message == ("limit FLEET_MAX_JOBS_PER_SESSION=3 reached (3 live jobs in the session)")
    assert store.redis.smembers(store.keys.live_jobs(sid)) == set(started)
    assert len(recorder.sent) == 3

    # When one of them ends, Then the next one is allowed
    end_job(store, started[0])
    jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    assert store.redis.scard(store.keys.live_jobs(sid)) == 3


def test_a_job_whose_lease_lapsed_no_longer_counts_against_its_session(
    store: Store, recorder: RecordingDispatcher, cwd: str, limit: Callable[[str, int], None]
) -> None:
    limit("FLEET_MAX_JOBS_PER_SESSION", 1)
    sid = sessions.create_session(store, cwd).session_id
    lost = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    store.redis.delete(store.keys.job_lease(lost))  # its worker vanished: the lease lapsed

    jobs.create_job(store, recorder, sid, 30, "sleep 30s")


def test_a_host_runs_n_live_jobs_the_next_one_it_takes_ends_refused_with_the_reason(
    store: Store, recorder: RecordingDispatcher, cwd: str, limit: Callable[[str, int], None]
) -> None:
    # Given a per-host cap of 2 and two jobs running on a host
    limit("FLEET_MAX_JOBS_PER_HOST", 2)
    host = f"host-{uuid.uuid4().hex[:8]}"
    sid = sessions.create_session(store, cwd).session_id
    first, second, third, fourth = (
        jobs.create_job(store, recorder, sid, 30, "sleep 30s") for _ in range(4)
    )
    assert [claim_job(store, j, host) for j in (first, second)] == ["ok", "ok"]

    # When a worker of that host takes a third, Then it ends refused with the limit's message
    reason = "limit FLEET_MAX_JOBS_PER_HOST=2 reached (2 live jobs on the host)"
    assert claim_job(store, third, host) == f"refused:{reason}"
    record = store.redis.hgetall(store.keys.job(third))
    assert (record["state"], record["reason"]) == (JobState.REFUSED, reason)
    assert third not in store.redis.smembers(store.keys.live_jobs(sid))
    # and another host is not limited by this one's count
    assert claim_job(store, fourth, f"{host}-other") == "ok"

    # When one of the host's jobs ends, Then the host takes the next one
    end_job(store, first)
    again = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    assert claim_job(store, again, host) == "ok"
    assert store.redis.smembers(store.keys.host_jobs(host)) == {second, again}


def test_a_session_may_have_n_live_reminders_the_next_is_refused_until_one_ends(
    store: Store, cwd: str, limit: Callable[[str, int], None]
) -> None:
    # Given a cap of 2 reminders and a session with 2 armed
    limit("FLEET_MAX_REMINDERS_PER_SESSION", 2)
    sid = sessions.create_session(store, cwd).session_id
    armed = [reminders.create_reminder(store, sid, 60, "later") for _ in range(2)]

    # When a third is asked for, Then it is refused and nothing is stored
    message = refused(lambda: reminders.create_reminder(store, sid, 60, "later"))
    assert message == "limit FLEET_MAX_REMINDERS_PER_SESSION=2 reached (2 live reminders)"
    assert store.redis.smembers(store.keys.live_reminders(sid)) == set(armed)

    # When one is deleted, Then the next one is allowed
    assert reminders.stop_reminders(store, sid, [armed[0]]) == 1
    reminders.create_reminder(store, sid, 60, "later")


def test_subagents_nest_n_deep_and_one_deeper_is_refused(
    store: Store, cwd: str, limit: Callable[[str, int], None]
) -> None:
    # Given a depth cap of 2 and a root with a child and a grandchild (depth 2)
    limit("FLEET_MAX_SUBAGENT_DEPTH", 2)
    root, child, grandchild = chain(store, 2, cwd)

    # When the grandchild spawns, Then it is refused and nothing is created
    message = refused(lambda: sessions.create_session(store, cwd, grandchild.session_id))
    assert (
        message == "limit FLEET_MAX_SUBAGENT_DEPTH=2 reached (the spawning session is at depth 2)"
    )
    assert store.redis.smembers(store.keys.children(grandchild.session_id)) == set()

    # and a spawn within the depth is still allowed
    sessions.create_session(store, cwd, child.session_id)
    sessions.create_session(store, cwd, root.session_id)


def test_a_session_may_have_n_live_subagents_the_next_is_refused_until_one_goes_quiet(
    store: Store, cwd: str, limit: Callable[[str, int], None]
) -> None:
    # Given a cap of 2 live subagents and a parent with 2 children that have live work
    # (a reminder each) and one that has none
    limit("FLEET_MAX_SUBAGENTS_PER_SESSION", 2)
    parent = sessions.create_session(store, cwd).session_id
    busy = [sessions.create_session(store, cwd, parent).session_id for _ in range(2)]
    work = [reminders.create_reminder(store, c, 60, "later") for c in busy]

    # When it spawns a third, Then it is refused naming the live count
    message = refused(lambda: sessions.create_session(store, cwd, parent))
    assert message == "limit FLEET_MAX_SUBAGENTS_PER_SESSION=2 reached (2 live subagents)"
    assert store.redis.smembers(store.keys.children(parent)) == set(busy)

    # When one child's work ends, Then the next spawn is allowed
    assert reminders.stop_reminders(store, busy[0], [work[0]]) == 1
    sessions.create_session(store, cwd, parent)


def test_a_limit_of_zero_forbids_the_kind(
    store: Store, recorder: RecordingDispatcher, cwd: str, limit: Callable[[str, int], None]
) -> None:
    limit("FLEET_MAX_JOBS_PER_SESSION", 0)
    limit("FLEET_MAX_SUBAGENT_DEPTH", 0)
    sid = sessions.create_session(store, cwd).session_id

    assert "(0 live jobs in the session)" in refused(
        lambda: jobs.create_job(store, recorder, sid, 1, "sleep 1s")
    )
    assert "FLEET_MAX_SUBAGENT_DEPTH=0" in refused(lambda: sessions.create_session(store, cwd, sid))
