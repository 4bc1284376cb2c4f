"""What the two watchdog processes share: the exec warden (``orchestrator/process/execwatch.py``),
which kills a frozen turn worker's shell commands, and the job watchdog
(``orchestrator/job/jobwatch.py``), which kills a frozen job worker's jobs.

* The lease rule: a watched process is killed once less than a third of its lease is left
  (``kill_margin``), read every eighth of a lease (``poll_interval``), so it is dead before
  the lease lapses and the census stops counting its work.
* How a worker starts one (``spawn``): ``python -P -m MODULE``, ending with the thread that
  starts it (``PR_SET_PDEATHSIG``, SIGTERM), in a session of its own (a signal to the worker's
  process group does not reach it), the store's URL in its environment, never on its command
  line. So does the worker's containment scope (``scope_env``): when the SIGTERM
  says the worker itself died, the watchdog kills every process tree the worker left in it
  (what left its leader's group) before it exits
  (``kill_scope_on_parent_death``).
* How one sets itself up (``own_store``): logging as its worker logs (``FLEET_LOG_FORMAT``,
  its lines marked with the worker's family), and a store whose reads give up after
  ``READ_TIMEOUT``: a stalled Redis must not hold up a kill, which then goes by the lapse
  time last read (the server's TTLs keep running).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import logs
from orchestrator.process import cgroups, containment, subreaper
from orchestrator.process.containment import SCOPE_ENV, Mode, mode
from orchestrator.process.processes import die_with_parent
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store

#: Seconds one read may take in a watchdog (its store's socket timeouts).
READ_TIMEOUT = 0.5


def kill_margin(lease_ms: int) -> float:
    """Seconds of lease left below which a watched process is killed: a third of it."""
    return lease_ms / 3000


def poll_interval(lease_ms: int) -> float:
    """Seconds between two reads of a lease: an eighth of it (at least 50 ms)."""
    return max(0.05, lease_ms / 8000)


def spawn(store: Store, module: str, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``python -P -m module args...`` as a watchdog of the caller's thread (see the
    module docstring) for ``store``; ``popen`` goes to ``subprocess.Popen`` (its pipes).
    Raises ``OSError``."""
    env = {
        **os.environ,
        "FLEET_REDIS_URL": store.url,
        "FLEET_KEY_PREFIX": store.keys.prefix,
        **scope_env(),
    }
    return subprocess.Popen(
        [sys.executable, "-P", "-m", module, *args],
        env=env,
        preexec_fn=watchdog_preexec(),
        **popen,
    )


def own_store(name: str, family: str) -> Store:
    """In watchdog ``name`` of a ``family`` worker: configure logging and return its store
    (``READ_TIMEOUT``), and kill its worker's process trees when it dies. Exits when
    ``FLEET_REDIS_URL`` is not set."""
    settings = FleetSettings()  # this watchdog process's entry point: read once, passed on
    logs.configure(settings.log_format or None, filters=[logs.FixedContext(family=family)])
    containment.choose(settings.containment)
    kill_scope_on_parent_death()
    if not settings.redis_url:
        raise SystemExit(f"{name}: FLEET_REDIS_URL is not set")
    return Store(
        settings.redis_url,
        settings.key_prefix,
        socket_timeout=READ_TIMEOUT,
        connect_timeout=READ_TIMEOUT,
        settings=settings,
    )


#: Seconds a watchdog told that its worker's thread ended waits for the worker itself to be
#: gone (its other threads end a moment after the first when it is killed).
_OWNER_GONE_WAIT = 2.0


def watchdog_preexec() -> Callable[[], None]:
    """The ``preexec_fn`` of a worker's watchdog process: it gets SIGTERM when the worker's
    thread that starts it dies (``processes.die_with_parent``), held blocked until the
    watchdog's ``kill_scope_on_parent_death`` handles it, so a worker that dies while its
    watchdog still starts up is not missed."""
    then = die_with_parent(signal.SIGTERM)

    def _preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        then()

    return _preexec


def kill_scope_on_parent_death(scope_path: str | None = None) -> None:
    """In a worker's watchdog process (started with ``watchdog_preexec``): on SIGTERM (sent
    by the kernel when the worker's thread that started it dies), kill every tree of the
    worker's scope (``scope_path``, or ``SCOPE_ENV``) if the worker itself is gone (this
    process was reparented), then exit; SIGTERM is unblocked here. Without a scope, SIGTERM
    just ends the process."""
    path = scope_path if scope_path is not None else os.environ.get(SCOPE_ENV, "")
    owner = Path(path).name[1:].partition("-")[0] if path else ""

    def _on_term(signum: int, frame: object) -> None:
        # The SIGTERM comes when the worker's thread that started this process ends. When the
        # worker was killed its other threads may not all be gone yet, and until they are
        # this process's parent is still the worker (a child is handed to another thread of
        # the same process first): wait a little for the worker to be gone for good.
        deadline = time.monotonic() + _OWNER_GONE_WAIT
        while owner.isdigit():
            if os.getppid() != int(owner):  # reparented: the worker is gone
                if path.startswith("/"):
                    cgroups.kill_cgroup(path)
                else:
                    subreaper.kill_marked(f"{path}/")
                break
            if time.monotonic() > deadline:
                break  # the worker lives on: only its thread ended
            time.sleep(0.005)
        os._exit(0)

    signal.signal(signal.SIGTERM, _on_term)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def scope_env() -> dict[str, str]:
    """The environment a watchdog needs to kill this process's trees when it dies
    (``SCOPE_ENV``: a cgroup path, or a scope mark), or ``{}`` in the other modes."""
    current = mode()
    if current is Mode.CGROUP:
        found: Path | str | None = cgroups.scope()
    elif current is Mode.SUBREAPER:
        found = subreaper.scope()
    else:
        return {}
    return {SCOPE_ENV: str(found)} if found is not None else {}
