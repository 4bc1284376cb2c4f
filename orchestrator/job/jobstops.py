"""Stops of jobs that no supervisor in this process runs: one still ``starting`` (no worker
took it yet), one running on another host (the stop is forwarded to its control queue), and
an orphan left running by an earlier worker of this host (killed only if its pid still names
its process, ``orchestrator/process/ownership.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.families import Dispatcher, Family, Task, control_queue
from orchestrator.job.jobs import JobState, end_job, job_fields
from orchestrator.process.containment import kill_tree_if_ours
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)


def stop_unclaimed(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    job_ids: list[str],
    *,
    local_host: str,
    local_instance: str,
    stop_local: Callable[[str], str],
) -> dict[str, str]:
    """Stop jobs the caller (worker instance ``local_instance`` on ``local_host``) did not
    supervise when it looked: still ``starting`` -> ``stopped`` (the worker that takes one
    later finds it stopped); running on another host -> the stop is forwarded to that host's
    queue; claimed by this instance since the caller looked (its ``job.run`` raced the stop)
    -> ``stop_local(jobId)``, which waits for its fork and stops it, or reports it ended;
    claimed by an earlier worker of this host (an orphan) -> ``_stop_orphan``. Returns
    ``{jobId: outcome}``."""
    outcomes: dict[str, str] = {}
    for jid in job_ids:
        result = end_job(store, jid, JobState.STOPPED, was=JobState.STARTING)
        if result == "ok":
            outcomes[jid] = "stopped before it started"
            continue
        if result != JobState.RUNNING.value:
            outcomes[jid] = str(result)
            continue
        host, instance, pid, started, tree = job_fields(
            store, jid, "host", "instance", "pid", "pidStart", "tree"
        )
        if host and host != local_host:
            dispatcher.send(Task.JOB_STOP, [session_id, [jid]], control_queue(Family.JOB, host))
            outcomes[jid] = f"forwarded to {host}"
        elif instance == local_instance:
            outcomes[jid] = stop_local(jid)
        else:
            outcomes[jid] = _stop_orphan(store, session_id, jid, pid, started, tree or "")
    return outcomes


def _stop_orphan(
    store: Store, session_id: str, jid: str, pid: str | None, started: str | None, tree: str
) -> str:
    """A job left running by an earlier worker of this host: with no pid recorded it just
    ends ``stopped``; its process group is killed only if its pid still names the process
    that started at ``pidStart``, and so is its recorded cgroup (``tree``: what of the tree
    outlived its leader); otherwise the pid is not ours (reused, or another pid
    namespace), nothing is signalled and the job is recorded ``lost``."""
    extra = {"session_id": session_id, "family": "job"}
    if not pid:  # its worker died between the claim and the fork: there is nothing to signal
        end_job(store, jid, JobState.STOPPED)
        return "stopped (no process was recorded)"
    if kill_tree_if_ours(int(pid), started, tree):
        end_job(store, jid, JobState.STOPPED)
        log.warning("job %s: orphan of an earlier worker killed (pid %s)", jid, pid, extra=extra)
        return "orphan killed"
    end_job(store, jid, JobState.LOST)
    log.warning(
        "job %s: recorded lost, nothing signalled (pid %s is not its process here)",
        jid,
        pid,
        extra=extra,
    )
    return "lost (its process is not here)"
