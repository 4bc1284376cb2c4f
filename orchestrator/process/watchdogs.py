"""What the two watchdog processes share: the exec warden (``orchestrator/process/execwatch.py``),
which kills a frozen turn worker's shell commands, and the job watchdog
(``orchestrator/job/jobwatch.py``), which kills a frozen job worker's jobs.

* The lease rule: a watched process is killed once less than a third of its lease is left
  (``kill_margin``), read every eighth of a lease (``poll_interval``), so it is dead before
  the lease lapses and the census stops counting its work.
* How a worker starts one (``spawn``): ``python -P -m MODULE``, ending with the thread that
  starts it (``PR_SET_PDEATHSIG``, SIGTERM), in a session of its own (a signal to the worker's
  process group does not reach it), the store's URL in its environment, never on its command
  line. So does the worker's containment scope (``containment.scope_env``): when the SIGTERM
  says the worker itself died, the watchdog kills every process tree the worker left in it
  (what left its leader's group) before it exits
  (``containment.kill_scope_on_parent_death``).
* How one sets itself up (``own_store``): logging as its worker logs (``FLEET_LOG_FORMAT``,
  its lines marked with the worker's family), and a store whose reads give up after
  ``READ_TIMEOUT``: a stalled Redis must not hold up a kill, which then goes by the lapse
  time last read (the server's TTLs keep running).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from orchestrator import logs
from orchestrator.process import containment
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
        **containment.scope_env(),
    }
    return subprocess.Popen(
        [sys.executable, "-P", "-m", module, *args],
        env=env,
        preexec_fn=containment.watchdog_preexec(),
        **popen,
    )


def own_store(name: str, family: str) -> Store:
    """In watchdog ``name`` of a ``family`` worker: configure logging and return its store
    (``READ_TIMEOUT``), and kill its worker's process trees when it dies. Exits when
    ``FLEET_REDIS_URL`` is not set."""
    settings = FleetSettings()  # this watchdog process's entry point: read once, passed on
    logs.configure(settings.log_format or None, filters=[logs.FixedContext(family=family)])
    containment.choose(settings.containment)
    containment.kill_scope_on_parent_death()
    if not settings.redis_url:
        raise SystemExit(f"{name}: FLEET_REDIS_URL is not set")
    return Store(
        settings.redis_url,
        settings.key_prefix,
        socket_timeout=READ_TIMEOUT,
        connect_timeout=READ_TIMEOUT,
        settings=settings,
    )
