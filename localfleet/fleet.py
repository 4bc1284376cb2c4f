"""Run a fleet on this machine: family worker processes, each a real ``fleet worker``.

Used by ``fleet up``, ``fleet demo`` and the test suite. Workers get their configuration
through the environment (``FLEET_REDIS_URL``, ``FLEET_KEY_PREFIX``, ``FLEET_HOSTNAME``) and
write their logs under ``<state_dir>/logs``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from orchestrator.families import get as family_spec
from orchestrator.families import names as family_names
from orchestrator.process.processes import die_with_parent
from orchestrator.settings import get_settings
from orchestrator.storage.keys import Keys
from orchestrator.storage.redisconn import SentinelOptions, sync_client


@dataclass
class WorkerProcess:
    """One worker: its family, host name, process and log file."""

    family: str  #: a registered family's name
    host: str
    process: subprocess.Popen[bytes]
    log_path: Path
    #: A control-only worker (``fleet worker --control``): it takes the family's stops only.
    control: bool = False

    @property
    def node(self) -> str:
        """Its Celery node name, as Flower shows it and its heartbeat key names it
        (``turn@host``, ``turn.ctl@host``)."""
        return family_spec(self.family).node_name(self.host, control_only=self.control)

    @property
    def role(self) -> str:
        """What its heartbeat key names before the node: the family or its control queue."""
        return family_spec(self.family).worker_name(control_only=self.control)


def controllable() -> tuple[str, ...]:
    """The families a control-only worker can serve (``fleet worker --control``): those whose
    stops need not run on the host owning the item."""
    return tuple(name for name in family_names() if not family_spec(name).host_stops)


@dataclass
class LocalFleet:
    """Family workers for one Redis URL and key prefix.

    ``job_hosts`` job workers are started with distinct host names (``<hostname>-1`` ...), so
    a stop for a job can be seen to reach exactly the host that owns it. Each family in
    ``control_families`` gets a control-only worker beside its own; by default every family
    that can have one (``turn``, ``subagent``, ``reminder``; ``job`` stops run on the host
    owning the process). A turn worker's threads are held by the steps an archive stops, so its
    stops would otherwise wait for one to end; the subagent and reminder workers take one
    message at a time, so a burst of archives queues their stops behind each other
    (benchmark 4's delivery hop).
    """

    redis_url: str
    key_prefix: str
    state_dir: Path
    hostname: str = "local"
    job_hosts: int = 1
    concurrency: int = 8
    control_families: tuple[str, ...] = field(default_factory=controllable)
    extra_env: dict[str, str] = field(default_factory=dict)
    workers: list[WorkerProcess] = field(default_factory=list)

    def env(self, host: str, family: str) -> dict[str, str]:
        """Environment of a worker process."""
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(
            {
                "FLEET_REDIS_URL": self.redis_url,
                "FLEET_KEY_PREFIX": self.key_prefix,
                "FLEET_HOSTNAME": host,
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def job_host_names(self) -> list[str]:
        """Host names of the job workers."""
        if self.job_hosts == 1:
            return [self.hostname]
        return [f"{self.hostname}-{i + 1}" for i in range(self.job_hosts)]

    def start(self, families: list[str] | None = None) -> LocalFleet:
        """Start one worker per family (``job_hosts`` for jobs), and a control-only one for
        each of them in ``control_families``. Returns self."""
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for family in families or family_names():
            spec = family_spec(family)
            hosts = self.job_host_names() if spec.host_stops else [self.hostname]
            for host in hosts:
                self.start_worker(family, host)
            if family in self.control_families:
                self.start_worker(family, self.hostname, control=True)
        return self

    def start_worker(
        self, family: str, host: str, *, control: bool = False, append: bool = True
    ) -> WorkerProcess:
        """Start one ``fleet worker`` process for ``family`` on ``host`` (``--control``:
        control-only)."""
        node = family_spec(family).node_name(host, control_only=control)
        log_path = self.state_dir / "logs" / f"{node}.log"
        cmd = [
            sys.executable,
            "-P",
            "-m",
            "api.cli",
            "worker",
            "--family",
            str(family),
            "--host",
            host,
            "--concurrency",
            str(self.concurrency),
            *(["--control"] if control else []),
        ]
        # A runner killed with SIGKILL takes its workers (and, through theirs, their jobs and
        # exec children) with it.
        proc = _start_logged(cmd, self.env(host, family), log_path, signal.SIGKILL)
        worker = WorkerProcess(family, host, proc, log_path, control)
        if append:
            self.workers.append(worker)
        return worker

    @property
    def api_log(self) -> Path:
        """Where ``fleet up`` appends its API's output: beside the workers' logs."""
        return self.state_dir / "logs" / "api.log"

    def start_api(self) -> subprocess.Popen[bytes]:
        """Start ``fleet api`` on this fleet's Redis as a child process that dies (SIGTERM)
        with this one, its output (the access log among it) appended to ``api_log``, as each
        worker's is to its own."""
        argv = [sys.executable, "-P", "-m", "api.cli", "api"]
        env = dict(os.environ, FLEET_REDIS_URL=self.redis_url)
        return _start_logged(argv, env, self.api_log, signal.SIGTERM)

    def restart_dead(self) -> list[tuple[WorkerProcess, WorkerProcess]]:
        """Start a replacement for every worker that exited; return (dead worker, its
        replacement) pairs (the dead one's ``process.returncode`` says how it ended)."""
        replaced = []
        for i, w in enumerate(self.workers):
            if w.process.poll() is not None:
                self.workers[i] = self.start_worker(
                    w.family, w.host, control=w.control, append=False
                )
                replaced.append((w, self.workers[i]))
        return replaced

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every started worker has a heartbeat in Redis. Raises
        ``RuntimeError`` with the log tail of a worker that died or never got ready."""
        client = sync_client(
            self.redis_url, SentinelOptions.from_settings(get_settings()), decode_responses=True
        )
        keys = Keys(self.key_prefix)

        def missing() -> list[WorkerProcess]:
            """The workers with no heartbeat yet; raises for one that exited."""
            out = []
            for w in self.workers:
                if w.process.poll() is not None:
                    raise RuntimeError(
                        f"worker {w.node} exited with {w.process.returncode}:\n{self.tail(w)}"
                    )
                key = keys.worker_heartbeat(w.role, w.node)
                if not client.exists(key):
                    out.append(w)
            return out

        polls = Retrying(
            stop=stop_after_delay(timeout), wait=wait_fixed(0.1), retry=retry_if_result(bool)
        )
        try:
            polls(missing)
        except RetryError as exc:
            w = exc.last_attempt.result()[0]
            raise RuntimeError(
                f"worker {w.node} not ready after {timeout:.0f}s:\n{self.tail(w)}"
            ) from None
        finally:
            client.close()

    @staticmethod
    def tail(worker: WorkerProcess, lines: int = 30) -> str:
        """The last ``lines`` lines of a worker's log."""
        try:
            text = worker.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every worker (SIGTERM: Celery's warm shutdown; SIGKILL after ``timeout``)."""
        for w in self.workers:
            if w.process.poll() is None:
                w.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for w in self.workers:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                w.process.wait(remaining)
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait(5)
        self.workers.clear()

    def __enter__(self) -> LocalFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start_logged(
    argv: list[str], env: dict[str, str], log_path: Path, death_signal: int
) -> subprocess.Popen[bytes]:
    """Start a child process that gets ``death_signal`` when this one dies, its stdout and
    stderr appended to ``log_path`` (its directory made if missing), no stdin. The ``-P`` in
    its argv keeps the working directory off ``sys.path``: a file there named like one of the
    project's modules (``acp.py``, ``orchestrator.py``) is never imported in its place."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv,
            preexec_fn=die_with_parent(death_signal, new_session=False),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
