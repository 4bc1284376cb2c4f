"""Jobs: background processes a session owns on one host, and their records.

A job is stored when a turn asks for it (state ``starting``, with a start lease), taken by one
job worker (``job_claim.lua``: refused if the lineage is archived by then), and supervised there
by ``JobSupervisor`` (``orchestrator/job/jobsupervisor.py``): the process runs contained
(``orchestrator/process/containment.py``: a cgroup of its own, or a PID namespace, which no
descendant
can leave), its leader dies with the worker (Linux ``PR_SET_PDEATHSIG``) and the rest of its
tree with it, and its lease is refreshed while it runs (``job_renew.lua``: only while the job is
still running and claimed by this worker). Liveness is the lease: a job whose worker died stops
counting once the lease lapses (``activity`` marks it ``lost``). A lost job is dead: a killed
worker's jobs die with it; a frozen worker's are killed by its watchdog
(``orchestrator/job/jobwatch.py``) before their leases lapse; a worker that resumes and finds a
job's renewal refused kills its process group and stops tracking it. When Redis itself stalls,
the watchdog freezes the jobs instead and resumes or kills them when it answers again (a
frozen tree's lapsed lease is the watchdog's to settle, while it lives).

This module holds a job's record: its states, its creation (``create_job``) and what a job
worker writes to it (``record_pid``, ``end_job``). The process side: spawning
(``orchestrator/job/jobspawn.py``), supervision, lease and stops
(``orchestrator/job/jobsupervisor.py``),
stops on gate closures (``orchestrator/job/jobgatewatch.py``), stops of jobs no supervisor here runs
(``orchestrator/job/jobstops.py``).
"""

from __future__ import annotations

from orchestrator.errors import TurnStopped
from orchestrator.families import Dispatcher, Family, Task, work_queue
from orchestrator.job import scripts
from orchestrator.session import limits
from orchestrator.session.fencing import StepGuard
from orchestrator.states import JobState as JobState
from orchestrator.storage.store import Store, iso, new_id, retried

#: A starting job not taken by any worker within this time stops counting as live (ms).
START_TIMEOUT_MS = 30_000


# The job records' plain reads and idempotent writes (same value, same TTL) go through the
# store's translation and bounded retry, so a Redis failure is StoreUnavailable, never a raw
# redis-py error; a task that meets it is retried (workers/retry.py).
@retried
def job_fields(store: Store, job_id: str, *fields: str) -> list[str | None]:
    found: list[str | None] = store.redis.hmget(store.keys.job(job_id), *fields)
    return found


@retried
def record_pid(store: Store, job_id: str, pid: int, started: float | None, tree: str) -> None:
    """Record the forked process of a job: its ``pid``, its start time (``pidStart``, as
    ``ownership.process_start`` reads it; empty when unknown) and its containment handle
    (``tree``). Raises ``StoreUnavailable``."""
    fields = {"pid": pid, "pidStart": "" if started is None else repr(started), "tree": tree}
    store.redis.hset(store.keys.job(job_id), mapping=fields)


def end_job(
    store: Store,
    job_id: str,
    state: JobState,
    exit_code: str = "",
    *,
    was: JobState = JobState.RUNNING,
    reason: str = "",
) -> str:
    """Record a job ended in ``state`` if it is still ``was`` (``job_end.lua``, at Redis's
    time). Returns ``ok``, or the job's state when it was not ``was``."""
    return scripts.job_end(
        store,
        job_id=job_id,
        state=state,
        exit_code=exit_code,
        now_iso=iso(store.now_ms()),
        allowed_from=(was,),
        reason=reason,
    )


def create_job(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    seconds: float,
    label: str,
    *,
    command: str = "",
    guard: StepGuard | None = None,
) -> str:
    """Store a starting job and send it to the job queue. Returns the job id. With
    ``command`` the job runs it with ``/bin/sh`` and is stopped after ``seconds``; without,
    it runs the supervisor's own command for ``seconds`` (``sleep``).

    With ``guard`` (the copy of the step that asks for the job) nothing is stored once its turn
    no longer runs or that copy no longer owns the step (``orchestrator/session/fencing.py``):
    raises
    ``TurnStopped``. Raises ``LimitReached`` when the session already has
    ``FLEET_MAX_JOBS_PER_SESSION`` live jobs (counted in the script that stores the job),
    ``StoreUnavailable``."""
    jid = new_id("job")
    maximum = limits.JOBS_PER_SESSION.maximum(store.settings)
    stored = scripts.job_create(
        store,
        job_id=jid,
        session_id=session_id,
        label=label,
        seconds=seconds,
        now_iso=iso(store.now_ms()),
        start_timeout_ms=START_TIMEOUT_MS,
        guard=guard,
        max_live=maximum,
        command=command,
    )
    if isinstance(stored, scripts.GuardLost):
        raise TurnStopped(guard.turn_id if guard else "")
    if isinstance(stored, scripts.AtLimit):
        raise limits.JOBS_PER_SESSION.reached(maximum, stored.live)
    dispatcher.send(Task.JOB_RUN, [session_id, jid], work_queue(Family.JOB))
    return jid
