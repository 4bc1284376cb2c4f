"""Test fixtures: a real Redis and real Celery worker processes.

Redis: ``FLEET_TEST_REDIS_URL`` if set; else the server on 127.0.0.1:6379 if one answers; else
an embedded server started for the run. Every run uses its own key prefix (state and broker
keys alike) and deletes only its own keys at the end, so it never touches anyone else's data.

The environment is set before any project module reads its settings, so the in-process Celery
app and the worker processes agree on the broker and the prefix.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.helpers import (
    STARTUP_TIMEOUT,
    RecordingDispatcher,
    revive,
    watched_fleets,
    watching,
)

_PREFIX = f"fleet-test-{uuid.uuid4().hex[:10]}:"
_EMBEDDED: Any = None


def _pick_redis() -> str:
    global _EMBEDDED
    url = os.environ.get("FLEET_TEST_REDIS_URL")
    if url:
        return url
    try:
        client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=0.5)
        client.ping()
        client.close()
        return "redis://127.0.0.1:6379/0"
    except redis.RedisError:
        pass
    from localfleet.embedded import EmbeddedRedis

    _EMBEDDED = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="fleet-test-redis-")))
    _EMBEDDED.start()
    return str(_EMBEDDED.url)


REDIS_URL = _pick_redis()
# rich fixes a console's width for good when COLUMNS is set as it is created (api/cli.py makes
# its consoles at import), and xdist workers inherit COLUMNS=80: tests set the width they need.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
os.environ["FLEET_REDIS_URL"] = REDIS_URL
os.environ["FLEET_KEY_PREFIX"] = _PREFIX
os.environ.setdefault("FLEET_JOB_LEASE_SECONDS", "2")
# The shared workers (and a test's beat) run no reconciler: tests that leave work outliving its
# archive on purpose call the reconciler themselves (tests/faults/test_reconciler.py).
os.environ.setdefault("FLEET_RECONCILE_INTERVAL_SECONDS", "0")
# Lineage rules are proven on chains up to 100 subagents deep (tests/orchestrator/test_gate.py),
# deeper than the production default allows; tests of the limit set it themselves.
os.environ.setdefault("FLEET_MAX_SUBAGENT_DEPTH", "200")
# Starlette's TestClient names the server "testserver" in every request's Host: the API serves
# that name like loopback's (api/guards.py's HostGuard refuses names it was not given).
os.environ.setdefault("FLEET_API_ALLOWED_HOSTS", "testserver")


#: The files that take longest (seconds of wall clock each, measured with ``--durations=0`` on
#: the 2-core machine), longest first. They run before every other file: xdist hands files
#: out in collection order (``--no-loadscope-reorder`` in pyproject's addopts), so a long file
#: never starts while the other workers are about to run out of work. A file missing here only
#: runs in its collection place; a name here that no longer exists changes nothing.
LONG_FILES = (
    "tests/faults/test_silent_connections.py",  # 50
    "tests/faults/test_failover.py",  # 40
    "tests/faults/test_step_fencing.py",  # 37
    "tests/faults/test_soak.py",  # 35
    "tests/faults/test_turn_sweeper.py",  # 29
    "tests/console/test_console.py",  # 25
    "tests/faults/test_sentinel.py",  # 21
    "tests/faults/test_noreplicas.py",  # 19
    "tests/faults/test_worker_broker.py",  # 18
    "tests/faults/test_races.py",  # 17
    "tests/api/test_demo.py",  # 16
    "tests/api/test_acp_redis_down.py",  # 16
    "tests/faults/test_killed_worker_children.py",  # 14
    "tests/api/test_up_children.py",  # 12
    "tests/faults/test_stops_and_reminders.py",  # 12
    "tests/faults/test_redis_down.py",  # 12
)


def _xdist_workers(config: pytest.Config) -> list[int]:
    """The xdist workers of this controller: its direct children running this Python (the
    controller runs no test itself, so no fleet or API of a test is among them; an embedded
    Redis is not Python). Empty in a worker or in a run without xdist."""
    import psutil

    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("dsession"):
        return []
    found = []
    for child in psutil.Process().children():
        try:
            if child.cmdline()[:1] == [sys.executable]:
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


def _end_as_ctrl_c_does(config: pytest.Config, signum: int, frame: object) -> None:
    """SIGTERM (a CI timeout, ``kill``, a supervisor) ends the run as Ctrl-C does: each xdist
    worker is sent SIGTERM too (Ctrl-C reaches the whole process group; a SIGTERM only this
    process), and every process raises ``KeyboardInterrupt``, so fixtures tear down and the
    fleets and APIs the tests started are stopped instead of left running. Once: a second
    SIGTERM must not cut that teardown short (SIGKILL still ends it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for pid in _xdist_workers(config):
        with contextlib.suppress(ProcessLookupError):  # gone meanwhile
            os.kill(pid, signal.SIGTERM)
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    # The unit tier (`pytest -m unit`: no Redis, no processes) runs in this one process, before
    # xdist (whose pytest_configure runs last) would start workers: each worker first collects
    # the whole suite, which takes longer than the tier's tests (65.8 s against 25.6 s here).
    if config.option.markexpr == "unit":
        config.option.dist = "no"
        config.option.numprocesses = 0
        config.option.tx = []
    # In the controller and in each xdist worker (each loads this file); signal handlers can
    # only be set from the main thread.
    if threading.current_thread() is threading.main_thread():
        signal.signal(
            signal.SIGTERM, lambda signum, frame: _end_as_ctrl_c_does(config, signum, frame)
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the ``LONG_FILES`` first, longest first; every other file keeps its place."""
    rank = {path: n for n, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"{_PREFIX}*", count=1000):
            client.delete(key)
    except redis.RedisError:
        pass
    finally:
        client.close()
    if _EMBEDDED is not None:
        _EMBEDDED.stop()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis."""
    return REDIS_URL


@pytest.fixture(scope="session")
def key_prefix() -> str:
    """This run's key prefix."""
    return _PREFIX


@pytest.fixture(scope="session")
def store() -> Iterator[Any]:
    """An ``orchestrator.storage.store.Store`` on the test Redis and prefix."""
    from orchestrator.storage.store import Store

    s = Store(REDIS_URL, _PREFIX)
    yield s
    s.close()


@pytest.fixture(scope="session")
def dispatcher() -> Any:
    """A Celery dispatcher publishing to this run's queues (by task name)."""
    from api.wiring import celery_dispatcher
    from orchestrator.settings import FleetSettings

    return celery_dispatcher(FleetSettings(redis_url=REDIS_URL, key_prefix=_PREFIX))


@pytest.fixture
def store_with() -> Iterator[Any]:
    """``store_with(**fields)``: a store on the test Redis and prefix whose settings are this
    run's with ``fields`` on top (``store_with(bulk_filter_max=3)``), a field that is a
    ``Store`` argument passed to it (``store_with(audit_max_per_session=3)``), for one test:
    the domain reads its settings from the store, so nothing process-wide is changed or
    reset."""
    from orchestrator.settings import FleetSettings
    from orchestrator.storage.store import Store

    made: list[Store] = []
    arguments = set(inspect.signature(Store).parameters)

    def make(**fields: Any) -> Store:
        own = {name: fields.pop(name) for name in list(fields) if name in arguments}
        made.append(Store(REDIS_URL, _PREFIX, settings=FleetSettings(**fields), **own))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def own_store() -> Iterator[Any]:
    """A store on a prefix of this test alone (for tests whose code acts on every member of a
    fleet-wide index, as a sweep does, or that check what is left under the prefix); its keys
    are deleted after the test."""
    from orchestrator.storage.store import Store

    prefix = f"{_PREFIX}own-{uuid.uuid4().hex[:8]}:"
    s = Store(REDIS_URL, prefix)
    try:
        yield s
    finally:
        for key in s.redis.scan_iter(match=f"{prefix}*", count=1000):
            s.redis.delete(key)
        s.close()


@pytest.fixture
def recorder() -> RecordingDispatcher:
    """A fresh ``RecordingDispatcher``."""
    return RecordingDispatcher()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Real worker processes for the four families (two job hosts: ``test-1``, ``test-2``),
    shared by the tests of a run; each test uses its own sessions."""
    from localfleet.fleet import LocalFleet

    f = LocalFleet(
        REDIS_URL,
        _PREFIX,
        tmp_path_factory.mktemp("fleet"),
        hostname="test",
        job_hosts=2,
        # Threads are cheap; the shared workers serve many tests at once, and the sweeper
        # resumes the long steps some tests leave behind: 8 threads were seen all taken.
        concurrency=16,
    )
    f.start()
    try:
        f.wait_ready(STARTUP_TIMEOUT)
        yield f
    finally:
        f.stop()


@pytest.fixture(autouse=True)
def _workers_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Keep a dead worker from costing more than one test: a test using the shared ``fleet``
    starts with every worker of it alive (a dead one is restarted, with a ``WorkerRestarted``
    warning naming it and quoting its log), and a worker dying during the test fails its next
    ``wait_for`` at once with the same details. Private fleets (tests/faults/fleets.py) are
    watched for their module's lifetime; here their dead workers are restarted too."""
    for label, fleet in watched_fleets():
        revive(fleet, label)
    if "fleet" not in request.fixturenames:
        yield
        return
    shared = request.getfixturevalue("fleet")
    revive(shared, "shared")
    with watching(shared, "shared"):
        yield
