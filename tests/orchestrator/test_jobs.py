"""Jobs: the start lease, the claim (refused for archived lineages), stops of unclaimed jobs.

No job process is ever started here: jobs are claimed through ``job_claim.lua`` directly and
never carry a pid.
"""

from __future__ import annotations

import pytest

from orchestrator.archiving import archive
from orchestrator.census.activity import census
from orchestrator.job import jobs
from orchestrator.job import scripts as job_scripts
from orchestrator.job.jobs import JobState
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain, claim_job, stop_jobs_elsewhere


def job(store: Store, jid: str) -> dict[str, str]:
    found: dict[str, str] = store.redis.hgetall(store.keys.job(jid))
    return found


@pytest.fixture
def sid(store: Store, cwd: str) -> str:
    return sessions.create_session(store, cwd).session_id


def test_a_new_job_is_starting_with_a_start_lease_and_is_sent_to_the_job_queue(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")

    assert job(store, jid)["state"] == JobState.STARTING
    assert 0 < store.redis.pttl(store.keys.job_lease(jid)) <= jobs.START_TIMEOUT_MS
    assert store.redis.smembers(store.keys.live_jobs(sid)) == {jid}
    assert recorder.sent == [("job.run", [sid, jid], "job")]


def test_claiming_a_starting_job_makes_it_run_on_that_host(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")

    assert claim_job(store, jid, "hostA") == "ok"

    h = job(store, jid)
    assert (h["state"], h["host"]) == (JobState.RUNNING, "hostA")
    assert store.redis.get(store.keys.job_lease(jid)) == "hostA"
    # A second worker taking the same job gets told it is running already
    assert claim_job(store, jid, "hostB") == JobState.RUNNING
    assert job(store, jid)["host"] == "hostA"


def test_claiming_a_job_of_an_archived_session_is_refused_and_it_is_not_live(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a starting job, and its session archived with stopActivity before any worker took it
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    archive.archive(store, recorder, sid, stop_activity=True)
    # When a job worker takes it
    outcome = claim_job(store, jid, "hostA")
    # Then it is refused naming the archived session, ends refused and is not live
    assert outcome == f"refused:{sid}"
    assert job(store, jid)["state"] == JobState.REFUSED
    assert not store.redis.exists(store.keys.job_lease(jid))
    assert census(store, sid) == []


def test_claiming_a_job_under_an_archived_ancestor_is_refused(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child = chain(store, 1, cwd)
    jid = jobs.create_job(store, recorder, child.session_id, 30, "sleep 30s")
    archive.archive(store, recorder, root.session_id, stop_activity=True)

    assert claim_job(store, jid, "hostA").startswith("refused:")
    assert job(store, jid)["state"] == JobState.REFUSED


def test_claiming_a_job_of_a_deleted_session_is_refused(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    sessions.delete_session(store, sid)

    assert claim_job(store, jid, "hostA") == f"refused:{sid}"
    assert job(store, jid)["state"] == JobState.REFUSED


def test_claiming_an_unknown_job_says_missing(store: Store) -> None:
    assert claim_job(store, "job_nope", "hostA") == "missing"


def test_stop_unclaimed_stops_a_starting_job_before_any_worker_takes_it(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a starting job
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    mark = len(recorder.sent)
    # When it is stopped by a worker that does not supervise it
    outcome = stop_jobs_elsewhere(store, recorder, sid, [jid])
    # Then it ends stopped, is no longer live, and a worker taking it later starts nothing
    assert outcome == {jid: "stopped before it started"}
    assert job(store, jid)["state"] == JobState.STOPPED
    assert census(store, sid) == []
    assert claim_job(store, jid, "hostB") == JobState.STOPPED
    assert recorder.sent[mark:] == []


def test_stop_unclaimed_forwards_the_stop_of_a_job_running_on_another_host(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    claim_job(store, jid, "hostB")
    mark = len(recorder.sent)

    outcome = stop_jobs_elsewhere(store, recorder, sid, [jid])

    assert outcome == {jid: "forwarded to hostB"}
    assert recorder.sent[mark:] == [("job.stop", [sid, [jid]], "job.ctl.hostB")]
    assert job(store, jid)["state"] == JobState.RUNNING


def test_stop_unclaimed_ends_a_local_orphan_recorded_without_a_process(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # A job recorded as running here by an earlier worker that this worker does not supervise
    # (no pid recorded, so there is no process to verify and nothing is signalled)
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    claim_job(store, jid, "hostA")

    outcome = stop_jobs_elsewhere(store, recorder, sid, [jid])

    assert outcome == {jid: "stopped (no process was recorded)"}
    assert job(store, jid)["state"] == JobState.STOPPED
    assert census(store, sid) == []


def test_stop_unclaimed_reports_jobs_that_already_ended(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    stop_jobs_elsewhere(store, recorder, sid, [jid])

    again = stop_jobs_elsewhere(store, recorder, sid, [jid, "job_nope"])

    assert again == {jid: JobState.STOPPED, "job_nope": "missing"}


def renew(store: Store, jid: str, instance: str = "hostA/test", lease_ms: int = 5000) -> str:
    return job_scripts.job_renew(store, job_id=jid, instance=instance, lease_ms=lease_ms)


def test_renewing_a_running_jobs_lease_extends_it_only_for_the_instance_that_claimed_it(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a job running on hostA (instance hostA/test)
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    claim_job(store, jid, "hostA")
    store.redis.pexpire(store.keys.job_lease(jid), 100)
    # When its instance renews the lease, it is extended
    assert renew(store, jid, lease_ms=7000) == "ok"
    assert store.redis.pttl(store.keys.job_lease(jid)) > 5000
    # When another instance of the host tries, it is refused and nothing changes
    store.redis.pexpire(store.keys.job_lease(jid), 100)
    assert renew(store, jid, "hostA/other") == "other"
    assert store.redis.pttl(store.keys.job_lease(jid)) <= 100


def test_a_lapsed_lease_is_never_renewed_whether_or_not_the_census_marked_the_job_lost(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a running job whose lease lapsed (its worker was frozen)
    jid = jobs.create_job(store, recorder, sid, 30, "sleep 30s")
    claim_job(store, jid, "hostA")
    store.redis.delete(store.keys.job_lease(jid))
    # When its worker resumes and renews: refused, the lease stays gone, the job is not live
    assert renew(store, jid) == "lapsed"
    assert not store.redis.exists(store.keys.job_lease(jid))
    assert census(store, sid) == []  # which marks it lost
    # When it renews again: refused with the job's state, nothing revived
    assert renew(store, jid) == JobState.LOST
    assert not store.redis.exists(store.keys.job_lease(jid))
    assert job(store, jid)["state"] == JobState.LOST
    assert renew(store, "job_unknown") == "missing"
