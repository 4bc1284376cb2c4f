"""``job.run`` and ``job.stop``; the job supervisor lives as long as the worker."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from orchestrator.census import activity
from orchestrator.job import jobstops
from workers.bulk import STOP_THREADS, each_session
from workers.runtime import get_runtime, role, supervisor

log = logging.getLogger(__name__)


def _is_job_worker() -> bool:
    return role().family == "job"


@worker_ready.connect
def _start_supervisor(**_: Any) -> None:
    if _is_job_worker():
        supervisor()


@worker_shutdown.connect
def _stop_supervisor(**_: Any) -> None:
    rt = get_runtime()
    if rt.supervisor is not None:
        rt.supervisor.shutdown()
    if rt.host_lease is not None:  # its processes are gone: the host name is free again
        rt.host_lease.release()


@shared_task(name="job.run", acks_late=True)
def run(session_id: str, job_id: str) -> dict[str, Any]:
    """Take a starting job and run its process on this host."""
    return {
        "sessionId": session_id,
        "jobId": job_id,
        "outcome": supervisor().start(session_id, job_id),
    }


@shared_task(name="job.stop", acks_late=True)
def stop(session_id: str, job_ids: list[str]) -> dict[str, Any]:
    """Stop the named jobs: those running here are terminated; those no worker has taken are
    marked stopped; those another host took meanwhile are forwarded to it."""
    rt = get_runtime()
    sup = supervisor()
    local = sup.owned()  # a job claimed here but not forked yet is ours too
    outcomes = sup.stop(session_id, [j for j in job_ids if j in local])
    others = [j for j in job_ids if j not in local]
    if others:
        outcomes.update(
            jobstops.stop_unclaimed(
                rt.store,
                rt.dispatcher,
                session_id,
                others,
                local_host=rt.host,
                local_instance=sup.instance,
                stop_local=lambda jid: sup.stop(session_id, [jid])[jid],
            )
        )
    activity.note_quiet(rt.store, session_id)
    return {"sessionId": session_id, "jobs": outcomes}


@shared_task(name="job.stop_many", acks_late=True)
def stop_many(stops: dict[str, list[str]]) -> dict[str, Any]:
    """Bulk form of ``job.stop`` (one message per host queue per bulk-archive batch):
    ``{sessionId: [jobIds]}``. Each session is stopped on its own; one that fails is logged
    and the others are still stopped."""
    return {"sessions": each_session(stops, stop, "job", threads=STOP_THREADS)}
