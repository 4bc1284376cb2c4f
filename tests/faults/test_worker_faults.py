"""Worker faults (killed and frozen workers) on a fleet of this module's own: real turn and job
worker processes on a fresh key prefix (run prefix + ``faults1:``), so killing them with
SIGKILL never disturbs the shared ``fleet``. The module drives them through its own ``Store``
and a ``CeleryDispatcher`` on a new Celery app configured for that prefix.

The workers redeliver an unacknowledged message after 3 s (``FLEET_VISIBILITY_TIMEOUT_
SECONDS``) instead of 60, so a step whose worker was killed comes back within the test."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.session.sessions import create_session, get_session
from orchestrator.turn.turns import start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.workers.support import (
    job_record,
    model_requests,
    process_alive,
    wait_drained,
    wait_gone,
    wait_job_pid,
    wait_log,
    wait_request,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = {"FLEET_VISIBILITY_TIMEOUT_SECONDS": "3"}
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "faults1", [Family.TURN, Family.JOB], env
    ) as fleet:
        yield fleet


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_step_redelivered_after_its_worker_was_killed_is_refused_by_the_gate(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given a turn in the middle of a 30 s model request
    sid = create_session(store, "/tmp/faults").session_id
    tid = start_turn(store, dispatcher, sid, "think 30\nsay never")
    wait_request(store, sid, tid, 0)

    # When its turn worker is killed with SIGKILL, and the session archived with stopActivity
    private.kill(Family.TURN)
    result = archive(store, dispatcher, sid, stop_activity=True)
    assert result.outcome == "archived" and result.stop_report.sent == {"turn": 1}
    archived_at = epoch(store.redis.hget(store.keys.session(sid), "archivedAt"))

    # And the worker is restarted
    w = private.restart(Family.TURN)

    # Then the step comes back (visibility timeout) and is refused by the gate
    wait_log(w, f"step 0 of turn {tid} refused by the gate", timeout=30)
    wait_drained(store, sid, 15)
    # And no model request was made after the archive committed
    made = [epoch(r["at"]) for r in model_requests(store, sid)]
    assert len(made) == 1 and all(at <= archived_at for at in made), made
    assert get_session(store, sid).quiet_at is not None


def test_a_killed_job_workers_processes_die_with_it_and_the_job_lapses_to_lost(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given a session owning two running jobs
    sid = create_session(store, "/tmp/faults").session_id
    jids = [jobs.create_job(store, dispatcher, sid, 81.3, f"sleep 81.3 #{n}") for n in range(2)]
    pids = [wait_job_pid(store, jid) for jid in jids]

    # When their job worker is killed with SIGKILL
    private.kill(Family.JOB)

    # Then its processes die with it (PR_SET_PDEATHSIG), nothing left behind
    for pid in pids:
        wait_gone(pid, 10)

    # When the session is archived with stopActivity and the worker restarted
    result = archive(store, dispatcher, sid, stop_activity=True)
    assert result.outcome == "archived"
    private.restart(Family.JOB)

    # Then the census reaches zero: the leases lapsed, so the jobs count as lost
    wait_drained(store, sid, 20)
    assert {job_record(store, jid)["state"] for jid in jids} <= {"lost", "stopped"}
    assert not any(process_alive(pid) for pid in pids)
