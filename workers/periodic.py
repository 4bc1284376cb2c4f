"""Background loops of a family's workers: the reminder poller (``background``: it waits on
Redis, not on a clock), the turn sweeper and the archive reconciler (``every``) each run as a
thread in every worker of their family, started once the worker is ready and ended when it
starts shutting down (``Runtime.stopping``).

Every loop body is safe to run on several workers at once (each decision it makes is one
script), so the fleet converges by itself while at least one worker of the family is up, with
no scheduler to deploy. A failing pass (Redis or the broker away) is logged and tried again on
the next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from orchestrator.settings import FleetSettings
from workers.runtime import Runtime, get_runtime, role

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loop:
    """A loop: the ``family`` whose workers run it, its thread ``name``, the seconds between
    two passes (``interval``: read from the worker's settings when the thread starts; 0 or
    less turns the loop off) and one pass (``run``). With no ``interval`` the loop keeps its
    own time: ``run`` is called once and returns when ``Runtime.stopping`` is set."""

    family: str
    name: str
    interval: Callable[[FleetSettings], float] | None
    run: Callable[[Runtime], None]


_LOOPS: list[Loop] = []


def every(
    family: str, name: str, interval: Callable[[FleetSettings], float]
) -> Callable[[Callable[[Runtime], None]], Callable[[Runtime], None]]:
    """Register the decorated pass to run every ``interval(settings)`` seconds in each worker
    of ``family`` (the worker's ``role().family``)."""

    def register(run: Callable[[Runtime], None]) -> Callable[[Runtime], None]:
        _LOOPS.append(Loop(family, name, interval, run))
        return run

    return register


def background(
    family: str, name: str
) -> Callable[[Callable[[Runtime], None]], Callable[[Runtime], None]]:
    """Register the decorated function to run in a thread of its own in each worker of
    ``family``, from the worker's start until it returns (once ``Runtime.stopping`` is set):
    a loop that waits on Redis rather than on a clock."""

    def register(run: Callable[[Runtime], None]) -> Callable[[Runtime], None]:
        _LOOPS.append(Loop(family, name, None, run))
        return run

    return register


def _forever(loop: Loop, rt: Runtime, period: float) -> None:
    while not rt.stopping.wait(period):
        try:
            loop.run(rt)
        except Exception as exc:  # Redis or broker down: try again on the next tick
            log.warning("%s failed: %s: %s", loop.name, type(exc).__name__, exc)


@worker_ready.connect
def _start(**_: Any) -> None:
    rt = get_runtime()
    served = role()
    for loop in _LOOPS:
        # A control-only worker takes stops and nothing else: the family's loops run in its
        # full workers.
        ours = loop.family == served.family and not served.control_only
        if ours and loop.interval is None:
            threading.Thread(target=loop.run, args=(rt,), name=loop.name, daemon=True).start()
            continue
        period = loop.interval(rt.settings) if ours and loop.interval else 0
        if period > 0:
            threading.Thread(
                target=_forever, args=(loop, rt, period), name=loop.name, daemon=True
            ).start()


@worker_shutdown.connect
def _stop(**_: Any) -> None:
    get_runtime().stopping.set()
