"""A job host's gate watch (``JobSupervisor``, ``orchestrator/jobs.py``) outlives a Redis
crash: Redis is SIGKILLed and restarted (append-only, same port) while a job runs, and an
archive made after the restart still stops the job with no stop request delivered."""

from __future__ import annotations

import logging

import pytest

from api.embedded import EmbeddedRedis
from orchestrator import archive, jobs, sessions
from orchestrator.jobs import JobState
from orchestrator.store import Store
from tests.faults.test_redis_durability import crash_and_restart
from tests.helpers import RecordingDispatcher, wait_for
from tests.workers.support import process_alive

pytestmark = pytest.mark.timeout(60)


def test_the_gate_watch_follows_again_after_redis_is_killed_and_restarted(
    private_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job running under a supervisor whose watch follows the stream of a private Redis
    store = Store(private_redis.url, "gatewatch:")
    sup = jobs.JobSupervisor(store, "host-restart", lease_ms=20_000, grace_seconds=1)
    try:
        sid = sessions.create_session(store, "/tmp/gate-watch").session_id
        jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
        assert sup.start(sid, jid) == "running"
        pid = sup.pids()[jid]

        # When Redis is SIGKILLed and restarted, and the watch has met the outage
        with caplog.at_level(logging.INFO, logger="orchestrator.jobs"):
            crash_and_restart(private_redis)
            wait_for(
                lambda: "following the event stream again" in caplog.text,
                15,
                message="the watch to follow again",
            )
            assert "job gate watch:" in caplog.text  # the failure, logged once
        assert process_alive(pid)

        # And the session is archived with stopActivity, its stop request never delivered
        archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)

        # Then the host stops the job all the same
        wait_for(lambda: not process_alive(pid), 10, message="the job to end")
        wait_for(
            lambda: store.redis.hget(store.keys.job(jid), "state") == JobState.STOPPED,
            10,
            message="the job recorded stopped",
        )
    finally:
        sup.shutdown()
        store.close()
