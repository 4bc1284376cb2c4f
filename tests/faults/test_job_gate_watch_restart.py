"""A job host hears the gate's closures through Redis faults (``JobSupervisor`` and
``gate.listen``): on a private Redis, SIGKILLed and restarted, or whose subscription
connections are killed while an archive's closure is lost, or whose connections go silent
(a proxy of the tests' own stops forwarding), an archive still stops the job with no stop
request delivered."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from localfleet.embedded import EmbeddedRedis
from orchestrator.archiving import archive
from orchestrator.job import jobs
from orchestrator.job.jobs import JobState
from orchestrator.job.jobsupervisor import JobSupervisor
from orchestrator.session import gate, sessions
from orchestrator.storage.store import Store
from tests.faults.test_redis_durability import crash_and_restart
from tests.helpers import RecordingDispatcher, wait_for
from tests.tcp_proxy import TcpProxy
from tests.workers.support import process_alive

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(private_redis: EmbeddedRedis) -> Iterator[Store]:
    s = Store(private_redis.url, "gatewatch:")
    yield s
    s.close()


@pytest.fixture
def supervisor(store: Store) -> Iterator[JobSupervisor]:
    sup = JobSupervisor(store, "host-restart", lease_ms=20_000, grace_seconds=1)
    yield sup
    sup.shutdown()


def running_job(store: Store, sup: JobSupervisor) -> tuple[str, str, int]:
    """A new session's job running under ``sup``: ``(sid, jid, pid)``."""
    sid = sessions.create_session(store, "/tmp/gate-watch").session_id
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
    assert sup.start(sid, jid) == "running"
    return sid, jid, sup.pids()[jid]


def subscribed(store: Store) -> bool:
    event = gate.listening(store)
    return event is not None and event.is_set()


def stopped(store: Store, jid: str, pid: int) -> None:
    wait_for(lambda: not process_alive(pid), 10, message="the job to end")
    wait_for(
        lambda: store.redis.hget(store.keys.job(jid), "state") == JobState.STOPPED,
        10,
        message="the job recorded stopped",
    )


def test_closures_are_heard_again_after_redis_is_killed_and_restarted(
    private_redis: EmbeddedRedis,
    store: Store,
    supervisor: JobSupervisor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a job running under a supervisor that hears the private Redis's closures
    sid, jid, pid = running_job(store, supervisor)
    wait_for(lambda: subscribed(store), 10, message="the subscription")

    # When Redis is SIGKILLed and restarted, and the subscription is made again
    with caplog.at_level(logging.INFO, logger="orchestrator.session.gate"):
        crash_and_restart(private_redis)
        wait_for(lambda: "gate closures heard again" in caplog.text, 15, message="heard again")
    assert "gate closures not heard" in caplog.text  # the failure, logged once
    assert process_alive(pid)

    # And the session is archived with stopActivity, its stop request never delivered
    archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)

    # Then the host stops the job all the same
    stopped(store, jid, pid)


def test_a_closure_lost_with_the_subscription_is_made_up_for_when_it_is_made_again(
    store: Store, supervisor: JobSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job running here, and the closure of its archive lost on the way (dropped as it
    # is read, and the subscription's connection killed right after)
    sid, jid, pid = running_job(store, supervisor)
    wait_for(lambda: subscribed(store), 10, message="the subscription")
    parse, lost = gate._closed_ids, threading.Event()

    def losing(data: object) -> frozenset[str] | None:
        closed = parse(data)
        if closed and sid in closed and not lost.is_set():
            lost.set()
            return frozenset()
        return closed

    monkeypatch.setattr(gate, "_closed_ids", losing)

    # When the session is archived with stopActivity (no stop request delivered)
    archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)
    assert lost.wait(10), "the closure was never read"
    assert process_alive(pid)
    store.redis.client_kill_filter(_type="pubsub")

    # Then once the subscription is made again, the host asks the gate about every job it
    # runs and stops this one
    stopped(store, jid, pid)


def test_a_closure_is_heard_although_the_subscriptions_connection_went_silent(
    private_redis: EmbeddedRedis, store: Store
) -> None:
    # Given a job host whose store reaches Redis through a proxy, running a job
    with TcpProxy(private_redis.port) as proxy:
        host_store = Store(proxy.url, "gatewatch:")
        sup = JobSupervisor(host_store, "host-silent", lease_ms=20_000, grace_seconds=1)
        try:
            sid, jid, pid = running_job(host_store, sup)
            wait_for(lambda: subscribed(host_store), 10, message="the subscription")
            # When every connection it holds goes silent (no reset), and the session is
            # archived with stopActivity, its stop request never delivered
            assert proxy.freeze_open() > 0
            archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)
            # Then the host notices the silent subscription, makes it again, asks the gate
            # about every job it runs and stops this one
            wait_for(lambda: not process_alive(pid), 20, message="the job to end")
        finally:
            sup.shutdown()
            host_store.close()
