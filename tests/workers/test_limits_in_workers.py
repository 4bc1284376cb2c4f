"""A turn over ``FLEET_MAX_JOBS_PER_SESSION``, with real turn and job worker processes: the
instructions over the limit become failed tool calls naming it and the turn goes on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.turn import turns
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import wait_for
from tests.workers.support import history, sleep_processes, wait_turn_state

CAP = 3


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = {"FLEET_MAX_JOBS_PER_SESSION": str(CAP)}
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "limits", [Family.TURN, Family.JOB], env
    ) as fleet:
        yield fleet


def test_twenty_run_lines_over_a_cap_of_three_start_three_jobs_and_fail_seventeen_calls(
    private: PrivateFleet,
) -> None:
    store = private.store
    job_worker = private.worker(Family.JOB).process.pid
    sid = create_session(store, "/tmp").session_id

    # When a prompt of 20 `run 300` lines is answered with the cap at 3
    tid = turns.start_turn(store, private.dispatcher, sid, "\n".join(["run 300"] * 20))

    # Then the turn completes (it is neither crashed nor cut short)
    wait_turn_state(store, tid, "completed", timeout=60)
    settled = [
        u
        for u in history(store, sid)
        if u["sessionUpdate"] == "tool_call_update" and u["turnId"] == tid
    ]
    assert len(settled) == 20
    failed = [u for u in settled if u["status"] == "failed"]
    started = [u for u in settled if u["status"] == "completed"]
    assert (len(started), len(failed)) == (CAP, 20 - CAP)
    # every refusal names the limit and the live count, in the order the lines came
    assert settled[:CAP] == started
    for update in failed:
        text = update["content"][0]["content"]["text"]
        assert text == (
            "start_job refused: limit FLEET_MAX_JOBS_PER_SESSION=3 reached "
            "(3 live jobs in the session)"
        )
    # and exactly three job processes live on the job worker, no more
    wait_for(
        lambda: len(sleep_processes(job_worker, "300")) == CAP,
        30,
        message="three `sleep 300` job processes",
    )
    assert store.redis.scard(store.keys.live_jobs(sid)) == CAP
