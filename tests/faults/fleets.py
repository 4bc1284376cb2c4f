"""Worker fleets of a test module's own: real worker processes on a fresh key prefix (the run's
prefix + a name), so a module may stop, freeze and kill them without disturbing the shared
``fleet`` fixture or another module.

While the module runs its fleet is watched (``tests.helpers.watching``): a worker that dies
without the test stopping it through ``PrivateFleet.signal``/``kill`` fails the next
``wait_for`` at once, naming it and quoting its log, and is restarted before the next test.

A module declares its fleet in one fixture::

    @pytest.fixture(scope="module")
    def private(redis_url, key_prefix, tmp_path_factory) -> Iterator[PrivateFleet]:
        with private_fleet(redis_url, key_prefix, tmp_path_factory, "faults1",
                           [Family.TURN], {"FLEET_VISIBILITY_TIMEOUT_SECONDS": "3"}) as fleet:
            yield fleet
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from localfleet.fleet import LocalFleet, WorkerProcess
from orchestrator.families import Family
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from tests.helpers import STARTUP_TIMEOUT, stopping_on_purpose, watching
from workers.app import configure
from workers.dispatch import CeleryDispatcher


class PrivateFleet:
    """A module's ``fleet`` (``LocalFleet``), with the ``store`` and ``dispatcher`` of its
    prefix. Signals go to worker processes by PID."""

    def __init__(self, fleet: LocalFleet, store: Store, dispatcher: CeleryDispatcher) -> None:
        self.fleet = fleet
        self.store = store
        self.dispatcher = dispatcher

    def worker(self, family: Family) -> WorkerProcess:
        """The family's live worker, the newest if a restart left two (else its newest, dead
        or not)."""
        mine = [w for w in self.fleet.workers if w.family is family and not w.control]
        live = [w for w in mine if w.process.poll() is None]
        return (live or mine)[-1]  # the newest: a restarted worker comes after the dead one

    def signal(self, family: Family, sig: signal.Signals) -> None:
        """Send ``sig`` to the family's worker process (a signal that may end it marks its
        exit as the test's doing, so ``wait_for`` does not report it as a fault)."""
        w = self.worker(family)
        stopping_on_purpose(w.process.pid, sig)
        w.process.send_signal(sig)

    def kill(self, family: Family) -> None:
        """SIGKILL the family's worker process (no shutdown of any kind) and reap it."""
        w = self.worker(family)
        stopping_on_purpose(w.process.pid, signal.SIGKILL)
        w.process.send_signal(signal.SIGKILL)
        w.process.wait(10)

    def restart(self, family: Family) -> WorkerProcess:
        """Start a replacement for the family's worker if it exited, and wait for its
        heartbeat."""
        old = self.worker(family)
        if old.process.poll() is None:
            return old
        key = self.store.keys.worker_heartbeat(old.role, old.node)
        self.store.redis.delete(key)  # the dead worker's heartbeat must not count as ready
        self.fleet.restart_dead()
        self.fleet.wait_ready(STARTUP_TIMEOUT)
        return self.worker(family)


def sweeping(stuck: float, **more: str) -> dict[str, str]:
    """The environment of a fleet whose turn workers sweep for turns stuck ``stuck`` s (six
    passes per ``stuck``), with the broker's redelivery of unacknowledged messages out of the
    way (10 minutes), so that only the sweeper brings a lost step back; ``more`` on top."""
    return {
        "FLEET_VISIBILITY_TIMEOUT_SECONDS": "600",
        "FLEET_TURN_STUCK_SECONDS": str(stuck),
        **more,
    }


@contextlib.contextmanager
def private_fleet(
    redis_url: str,
    key_prefix: str,
    tmp_path_factory: Any,
    name: str,
    families: list[Family],
    env: dict[str, str],
    *,
    concurrency: int = 4,
    control: tuple[Family, ...] = (),
) -> Iterator[PrivateFleet]:
    """Start one worker per family in ``families`` on prefix ``key_prefix + name + ':'`` with
    ``env`` on top of the test environment, and a control-only worker for each in
    ``control`` (none by default: a fault test signals the family's one worker); stop them
    and delete the prefix's keys after."""
    prefix = f"{key_prefix}{name}:"
    store = Store(redis_url, prefix)
    app = Celery(f"agent_fleet_{name}")
    configure(app, FleetSettings(redis_url=redis_url, key_prefix=prefix))
    state: Path = tmp_path_factory.mktemp(f"{name}-fleet")
    fleet = LocalFleet(
        redis_url,
        prefix,
        state,
        hostname=name,
        concurrency=concurrency,
        control_families=tuple(control),
        extra_env=env,
    )
    fleet.start(families)
    try:
        fleet.wait_ready(STARTUP_TIMEOUT)
        with watching(fleet, name):
            yield PrivateFleet(fleet, store, CeleryDispatcher(app))
    finally:
        for w in fleet.workers:  # a failed test may have left one stopped: it would ignore TERM
            if w.process.poll() is None:
                w.process.send_signal(signal.SIGCONT)
        fleet.stop()
        for key in store.redis.scan_iter(match=f"{prefix}*", count=1000):
            store.redis.delete(key)
        store.close()
        app.close()
