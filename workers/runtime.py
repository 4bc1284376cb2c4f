"""Per-process runtime for tasks: the settings, the store, the dispatcher, the model and, in
job workers, the job supervisor.

The worker's entry point (``fleet worker``, or ``workers.main`` for ``celery -A``) reads its
``FleetSettings`` once, builds the Celery app from them and hands both to ``install``; the
runtime is built from them on first use, and every task, loop and signal handler of the
process reads its settings from it."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.signals import celeryd_init
from tenacity import Retrying, before_sleep_log, retry_if_exception_type, wait_exponential

# Imported here, before the worker starts: Celery imports the task modules with the working
# directory first on sys.path (celery.utils.imports.import_from_cwd), where a file named like
# a module (an ``acp.py`` in a fleet's directory) would stand in for it. The agent runtime
# and the ACP SDK it uses are loaded from the installation first.
from orchestrator.agents import pool as _agent_pool  # noqa: F401
from orchestrator.errors import StoreUnavailable
from orchestrator.job.jobsupervisor import JobSupervisor
from orchestrator.models.model import Model, ScriptedModel
from orchestrator.process import containment
from orchestrator.process.ownership import HostLease
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from workers.dispatch import CeleryDispatcher

log = logging.getLogger(__name__)

#: Seconds a job process gets between SIGTERM and SIGKILL when it is stopped.
JOB_KILL_GRACE_SECONDS = 2.0


@dataclass
class Runtime:
    """What tasks need: ``settings``, ``store``, ``dispatcher``, ``model``, ``host`` and (job
    workers only) ``supervisor``."""

    settings: FleetSettings
    store: Store
    dispatcher: CeleryDispatcher
    model: Model
    host: str
    supervisor: JobSupervisor | None = None
    #: Job workers: this process's lease on ``host`` (its instance id goes on every job it
    #: claims), taken at start-up by ``hold_job_host``.
    host_lease: HostLease | None = None
    #: Set when the worker begins to shut down (``workers.heartbeat``): in-flight steps hand
    #: their turn back, the reminder poller and the heartbeat stop.
    stopping: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Role:
    """What this worker process serves, as its command line says (``--family``,
    ``--control`` of ``fleet worker`` and of ``celery -A workers.main worker``): ``family``
    (``turn``, ``job``, ``subagent``, ``reminder``; empty outside family workers) picks its
    heartbeat and background loops; ``control_only``: it consumes only the family's control
    queue (``<family>.ctl``: the stops), runs no background loop and its heartbeat is not
    counted by ``/ready``."""

    family: str = ""
    control_only: bool = False


_role = Role()


def role() -> Role:
    """This process's ``Role`` (the empty one before the worker starts, and outside workers)."""
    return _role


@celeryd_init.connect
def _take_role(options: dict[str, Any] | None = None, **_: Any) -> None:
    """Read the role from the worker's options as the worker starts, before its logging and
    its steps are set up."""
    global _role
    given = options or {}
    _role = Role(str(given.get("family") or ""), bool(given.get("control")))


_installed: tuple[FleetSettings, Celery] | None = None
_runtime: Runtime | None = None
_lock = threading.Lock()


def install(settings: FleetSettings, app: Celery) -> None:
    """Hand this worker process its settings and its Celery app (built from them by
    ``workers.app.create_app``); called once by the entry point, before the worker starts.
    The process's trees are contained as ``FLEET_CONTAINMENT`` asks (``containment.choose``)."""
    global _installed, _runtime
    containment.choose(settings.containment)
    with _lock:
        _installed = (settings, app)
        _runtime = None


def installed_settings() -> FleetSettings | None:
    """The settings ``install`` was given, or None before (or outside) a worker."""
    installed = _installed
    return installed[0] if installed is not None else None


def get_runtime() -> Runtime:
    """The process's runtime, created on first call from what ``install`` was given. Raises
    ``RuntimeError`` in a process whose entry point installed nothing."""
    global _runtime
    with _lock:
        if _runtime is None:
            if _installed is None:
                raise RuntimeError(
                    "no worker settings installed: start workers with `fleet worker` or "
                    "`celery -A workers.main worker`"
                )
            settings, app = _installed
            _runtime = Runtime(
                settings=settings,
                store=Store(settings.require_redis_url(), settings.key_prefix, settings=settings),
                dispatcher=CeleryDispatcher(app),
                model=build_model(settings),
                host=settings.hostname,
            )
        return _runtime


def build_model(settings: FleetSettings) -> Model:
    """The model backend ``FLEET_MODEL`` names: ``scripted`` or ``openai`` (configured by
    ``FLEET_OPENAI_*``, its server and key by the SDK's ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY``)."""
    if settings.model == "openai":
        # Imported here: the openai package takes most of a worker's start-up imports (0.7 of
        # 1.7 s of CPU here), and a fleet on the scripted model never needs it.
        from orchestrator.models.openai_model import OpenAIModel

        return OpenAIModel(
            model=settings.openai_model,
            max_retries=settings.openai_max_retries,
        )
    return ScriptedModel()


def current_runtime() -> Runtime | None:
    """The process's runtime if it was created, read without the lock (safe in a signal
    handler that may have interrupted ``get_runtime``)."""
    return _runtime


def hold_job_host() -> HostLease:
    """Take this job worker's host name before it consumes anything (``ownership.HostLease``,
    one lease per ``FLEET_JOB_LEASE_SECONDS``). Raises ``HostHeld`` naming the live worker
    that holds it; waits as long as Redis cannot be reached."""
    rt = get_runtime()
    lease = HostLease(rt.store, rt.host, lease_ms=int(rt.settings.job_lease_seconds * 1000))
    # A worker (re)started while Redis is down or loading waits for it, as Celery waits for
    # its broker at start-up (broker_connection_retry_on_startup), instead of exiting.
    for attempt in Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=wait_exponential(multiplier=0.2, max=5),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    ):
        with attempt:
            lease.acquire()
    rt.host_lease = lease
    return lease


def supervisor() -> JobSupervisor:
    """The job supervisor of this process (job workers), created on first call."""
    rt = get_runtime()
    with _lock:
        if rt.supervisor is None:
            settings = rt.settings
            rt.supervisor = JobSupervisor(
                rt.store,
                rt.host,
                lease_ms=int(settings.job_lease_seconds * 1000),
                grace_seconds=JOB_KILL_GRACE_SECONDS,
                instance=rt.host_lease.instance if rt.host_lease else None,
            )
        return rt.supervisor
