"""Decisions use the store's clock, across real processes: a reminder worker whose clock is an
hour behind runs the archive reconciler, while the API (this process) archives with its clock
an hour ahead. Both read Redis ``TIME`` for every time they store or compare, so the archive's
reconcile grace ends as it would with true clocks and the lost reminder stop is sent again.

The worker's clock is skewed without LD_PRELOAD: a ``sitecustomize`` module in a directory put
first on its ``PYTHONPATH`` moves ``time.time`` by ``FLEET_TEST_CLOCK_SKEW_SECONDS``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.families import Family, Task
from orchestrator.reminder import reminders
from orchestrator.session.sessions import create_session
from orchestrator.storage import metrics
from orchestrator.storage.store import Store
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import FaultyDispatcher, wait_for

pytestmark = pytest.mark.timeout(120)

HOUR = 3600.0

_SITECUSTOMIZE = textwrap.dedent(
    """
    import os
    import time

    _skew = float(os.environ.get("FLEET_TEST_CLOCK_SKEW_SECONDS") or 0)
    if _skew:
        _time, _time_ns = time.time, time.time_ns
        time.time = lambda: _time() + _skew
        time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
    """
)


def skew_env(directory: Path, seconds: float) -> dict[str, str]:
    """Environment that starts a Python process with its clock moved by ``seconds``."""
    (directory / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "FLEET_TEST_CLOCK_SKEW_SECONDS": str(seconds)}


@pytest.fixture(scope="module")
def behind(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    """A reminder worker (it runs the reconciler loop every 0.5 s, grace 2 s) whose clock is an
    hour behind."""
    env = skew_env(tmp_path_factory.mktemp("skew"), -HOUR)
    env.update({"FLEET_RECONCILE_INTERVAL_SECONDS": "0.5", "FLEET_RECONCILE_GRACE_SECONDS": "2"})
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "clockskew", [Family.REMINDER], env
    ) as fleet:
        yield fleet


def test_the_skew_reaches_a_process_started_with_that_environment(
    tmp_path: Path,
) -> None:
    env = dict(os.environ, **skew_env(tmp_path, -HOUR))
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert abs(float(out.stdout) - (time.time() - HOUR)) < 60


def test_a_lost_reminder_stop_is_sent_again_when_the_api_clock_is_an_hour_ahead(
    behind: PrivateFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = behind.store
    # Given a session with a reminder armed for later
    sid = create_session(store, "/tmp/clock-skew").session_id
    rid = reminders.create_reminder(store, sid, HOUR, "later")

    sent_before = reminder_stops_sent(store)

    # When the API, its clock an hour ahead, archives it with its work stopped, and the
    # reminder stop is lost on its way
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + HOUR)
    lossy = FaultyDispatcher(behind.dispatcher, drop=frozenset({Task.REMINDER_STOP}))
    archive(store, lossy, sid, stop_activity=True)
    monkeypatch.setattr(time, "time", real)
    assert [m[0] for m in lossy.dropped] == [Task.REMINDER_STOP]
    assert store.redis.hget(store.keys.reminder(rid), "state") == "armed"

    # Then the reconciler of the worker whose clock is an hour behind sees the grace end,
    # sends the stop again, and the reminder is stopped. The resend is read from the stop
    # count, where the lost stop counts too (its sender saw no error), not from the session's
    # reconcileAttempts, which the pass after the reminder stopped clears.
    wait_for(
        lambda: reminder_stops_sent(store) >= sent_before + 2,
        30,
        message="the reconciler to send the reminder stop again",
    )
    wait_for(
        lambda: store.redis.hget(store.keys.reminder(rid), "state") == "deleted",
        30,
        message="the stop sent again to delete the reminder",
    )


def reminder_stops_sent(store: Store) -> int:
    """Reminder stop requests sent so far under the store's key prefix
    (``fleet_stop_dispatches``, family ``reminder``)."""
    counts = metrics.snapshot(store).counters[metrics.STOP_DISPATCHES.name]
    return counts.get((str(Family.REMINDER),), 0)
