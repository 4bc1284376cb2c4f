"""Helpers for the orchestrator tests (import as ``from tests.orchestrator.support import ...``).

Everything here drives the domain through ``orchestrator`` functions only; no worker process
runs. ``deliver`` plays the part of the workers for recorded stop messages, so a test can see
what a stop does once it arrives without starting Celery.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

from orchestrator.archiving import subagents
from orchestrator.families import Task
from orchestrator.job import jobs, jobstops
from orchestrator.job import scripts as job_scripts
from orchestrator.models.model import Model
from orchestrator.reminder import reminders
from orchestrator.session import limits, sessions
from orchestrator.session.sessions import Session
from orchestrator.storage.store import Store
from orchestrator.turn import scripts as turn_scripts
from orchestrator.turn import steps, tools, turns
from tests.helpers import RecordingDispatcher

STOP_TASKS = frozenset({Task.TURN_STOP, Task.JOB_STOP, Task.SUBAGENT_STOP, Task.REMINDER_STOP})
#: The bulk forms, one message per family per batch (``orchestrator/archiving/bulk.py``).
STOP_MANY_TASKS = frozenset(
    {Task.TURN_STOP_MANY, Task.JOB_STOP_MANY, Task.SUBAGENT_STOP_MANY, Task.REMINDER_STOP_MANY}
)


def begin_step(
    store: Store, turn_id: str, *, index: int = 0, lease_ms: int = 5000, token: str = "a-copy"
) -> bool:
    """Begin step ``index`` of ``turn_id`` as the copy holding ``token`` (what a step's
    worker does first); returns whether it began."""
    began = turn_scripts.turn_begin_step(
        store, turn_id=turn_id, index=index, lease_ms=lease_ms, token=token
    )
    return isinstance(began, turn_scripts.Begun)


def unique_cwd() -> str:
    """An absolute cwd no other test uses, so a cwd-filtered listing sees only this test."""
    return f"/tmp/fleet-tests/{uuid.uuid4().hex}"


def chain(store: Store, depth: int, cwd: str | None = None) -> list[Session]:
    """A root session and ``depth`` nested subagents: ``[root, child, grandchild, ...]``."""
    where = cwd or unique_cwd()
    out = [sessions.create_session(store, where)]
    for _ in range(depth):
        out.append(sessions.create_session(store, where, parent_id=out[-1].session_id))
    return out


def stops(
    recorder: RecordingDispatcher, since: int = 0, *, bulk: bool = False
) -> list[tuple[str, list[Any], str]]:
    """The stop messages the recorder received (from index ``since`` on); with ``bulk``, their
    bulk forms (``STOP_MANY_TASKS``) too."""
    tasks = STOP_TASKS | STOP_MANY_TASKS if bulk else STOP_TASKS
    return [m for m in recorder.sent[since:] if m[0] in tasks]


def deliver(store: Store, recorder: RecordingDispatcher, messages: list[Any]) -> None:
    """Do what the family workers do with the given stop messages (no processes: jobs are only
    ever stored here, never forked, and never carry a pid)."""
    for task, args, queue in messages:
        if task in STOP_MANY_TASKS:
            # The workers' loop (workers/bulk.py): each session as its single stop would be.
            single = {
                Task.TURN_STOP_MANY: Task.TURN_STOP,
                Task.JOB_STOP_MANY: Task.JOB_STOP,
                Task.SUBAGENT_STOP_MANY: Task.SUBAGENT_STOP,
                Task.REMINDER_STOP_MANY: Task.REMINDER_STOP,
            }[task]
            deliver(store, recorder, [(single, [sid, ids], queue) for sid, ids in args[0].items()])
            continue
        if task == Task.TURN_STOP:
            turns.cancel_turns(store, recorder, args[0], list(args[1]))
        elif task == Task.JOB_STOP:
            host = queue.removeprefix("job.ctl.") if queue != "job.ctl" else "no-such-host"
            stop_jobs_elsewhere(store, recorder, args[0], list(args[1]), host)
        elif task == Task.SUBAGENT_STOP:
            subagents.stop_subagents(store, recorder, args[0], args[1])
        elif task == Task.REMINDER_STOP:
            reminders.stop_reminders(store, args[0], list(args[1]))
        else:  # pragma: no cover - a test passed something that is not a stop
            raise AssertionError(f"not a stop message: {task}")


def claim_job(store: Store, job_id: str, host: str = "hostA") -> str:
    """Take a starting job as a job worker on ``host`` would (no process is started)."""
    cap = limits.JOBS_PER_HOST.maximum(store.settings)
    template = limits.JOBS_PER_HOST.template(cap)
    return job_scripts.job_claim(
        store,
        job_id=job_id,
        host=host,
        lease_ms=5000,
        now_iso="2026-01-01T00:00:00Z",
        instance=f"{host}/test",
        max_per_host=cap,
        limit_template=template,
    )


def running_job(store: Store, cwd: str, proc: subprocess.Popen[bytes], started: object) -> str:
    """A new session's job, claimed by instance ``hostA/test`` (``claim_job``) and recorded
    as running ``proc``, started at ``started`` (``ownership.process_start``)."""
    sid = sessions.create_session(store, cwd).session_id
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 60, "sleep 60")
    claim_job(store, jid, "hostA")
    store.redis.hset(store.keys.job(jid), mapping={"pid": proc.pid, "pidStart": repr(started)})
    return jid


def model_requests(store: Store, session_id: str) -> list[str]:
    """The session's recorded model requests (JSON strings)."""
    found: list[str] = store.redis.lrange(store.keys.model_requests(session_id), 0, -1)
    return found


class FailingDispatcher(RecordingDispatcher):
    """Records like ``RecordingDispatcher`` but raises for the tasks in ``fail``."""

    def __init__(self, fail: set[str]) -> None:
        super().__init__()
        self.fail = fail

    def send(self, task: str, args: list[Any], queue: str) -> None:
        if task in self.fail:
            raise RuntimeError("broker down")
        super().send(task, args, queue)


def stop_jobs_elsewhere(
    store: Store, recorder: RecordingDispatcher, sid: str, job_ids: list[str], host: str = "hostA"
) -> dict[str, str]:
    """``jobstops.stop_unclaimed`` as a job worker of ``host`` (instance ``<host>/here``) that
    supervises no job runs it: the jobs' outcomes."""

    def no_local_jobs(job_id: str) -> str:  # no job is claimed by this instance
        raise AssertionError(f"job {job_id} is claimed by an instance that supervises nothing")

    return jobstops.stop_unclaimed(
        store,
        recorder,
        sid,
        job_ids,
        local_host=host,
        local_instance=f"{host}/here",
        stop_local=no_local_jobs,
    )


def run_turn(
    store: Store,
    recorder: RecordingDispatcher,
    sid: str,
    model: Model,
    prompt: str = "do the thing",
) -> str:
    """Start a turn with ``prompt`` and run its steps with ``model`` in this thread as the
    recorder receives them; returns the turn id once no step is left to run."""
    tid = turns.start_turn(store, recorder, sid, prompt)
    done = 0
    while True:
        sent = [a for t, a, _ in recorder.sent if t == "turn.step" and a[1] == tid]
        if len(sent) == done:
            return tid
        _, _, index = sent[done]
        steps.run_step(store, recorder, model, tools.run_tool, sid, tid, int(index))
        done += 1


class Delivering(RecordingDispatcher):
    """Delivers each stop as the family workers would, as it is sent (``deliver``)."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store

    def send(self, task: str, args: list[Any], queue: str) -> None:
        super().send(task, args, queue)
        if task in STOP_TASKS:
            deliver(self.store, self, [(task, args, queue)])
