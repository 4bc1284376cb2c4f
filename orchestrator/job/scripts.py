"""The job package's door to Redis: one function per Lua script beside it (``job_create.lua``,
``job_claim.lua``, ``job_renew.lua``, ``job_end.lua``).

Only this module builds those scripts' ARGV and reads their replies. A reply that is a
verdict with a payload (``refused:<why>``, ``archived:<holder>``) or a job's state stays a
string, its values listed on each function: callers log it and hand it on as it is. Every
function raises ``StoreUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.session.fencing import StepGuard
from orchestrator.session.scripts import AtLimit as AtLimit
from orchestrator.session.scripts import GuardLost as GuardLost
from orchestrator.session.scripts import launch_refusal
from orchestrator.states import JobState
from orchestrator.storage.store import Store


@dataclass(frozen=True)
class Stored:
    """``job_create``: the job is stored, ``starting``."""


def job_create(
    store: Store,
    *,
    job_id: str,
    session_id: str,
    label: str,
    seconds: float,
    now_iso: str,
    start_timeout_ms: int,
    guard: StepGuard | None,
    max_live: int,
    command: str,
) -> Stored | GuardLost | AtLimit:
    """Store a ``starting`` job of ``session_id`` that runs ``command`` (``""``: the worker's
    own ``sleep``) for ``seconds``; it stops counting as live if no worker takes it within
    ``start_timeout_ms``."""
    reply = store.run(
        "job_create",
        [
            job_id,
            session_id,
            label,
            seconds,
            now_iso,
            start_timeout_ms,
            *StepGuard.argv(guard),
            max_live,
            command,
        ],
    )
    refused = launch_refusal(reply)
    if refused is not None:
        return refused
    return Stored()


def job_claim(
    store: Store,
    *,
    job_id: str,
    host: str,
    lease_ms: int,
    now_iso: str,
    instance: str,
    max_per_host: int,
    limit_template: str,
) -> str:
    """A job worker (``instance`` on ``host``) takes a starting job with a lease of
    ``lease_ms``. Returns ``ok``, ``refused:<holder>`` (its lineage is archived),
    ``refused:<limit_template with the count>`` (the host runs ``max_per_host`` live jobs),
    ``missing``, or the job's state when it is not ``starting``."""
    return str(
        store.run(
            "job_claim",
            [job_id, host, lease_ms, now_iso, instance, max_per_host, limit_template],
        )
    )


def job_renew(
    store: Store,
    *,
    job_id: str,
    instance: str,
    lease_ms: int,
    pid: int | None = None,
    pid_start: str | None = None,
) -> str:
    """Renew a running job's lease for ``lease_ms``; with ``pid`` and ``pid_start`` (the job
    watchdog resuming a job it froze) take it again even if it lapsed. Returns ``ok``,
    ``revived``, ``lapsed``, ``other``, ``archived:<holder>``, ``missing``, or the job's state
    when it is not running."""
    args: list[object] = [job_id, instance, lease_ms]
    if pid is not None:
        args += [pid, pid_start or ""]
    return str(store.run("job_renew", args))


def job_end(
    store: Store,
    *,
    job_id: str,
    state: JobState,
    exit_code: str,
    now_iso: str,
    allowed_from: tuple[JobState, ...],
    reason: str = "",
) -> str:
    """Record the job ended in ``state`` if its state is one of ``allowed_from``. Returns
    ``ok``, ``missing``, or the job's state when it was not in ``allowed_from``."""
    was = ",".join(s.value for s in allowed_from)
    return str(store.run("job_end", [job_id, state.value, exit_code, now_iso, was, reason]))
