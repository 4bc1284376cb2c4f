"""Helpers shared by the tests (import as ``from tests.helpers import ...``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

#: Seconds a startup-only wait may take: a process importing and starting, a worker
#: registering, a server beginning to answer. Starting ``fleet acp`` or ``fleet api`` costs
#: about 2 s of CPU, and on a 2-core machine at load average 20 a process gets a tenth of a core,
#: so this is generous; ``FLEET_TEST_STARTUP_TIMEOUT`` overrides it. It bounds only readiness
#: waits, never what a test asserts, and ``wait_until_up`` still fails at once if the process
#: exits.
STARTUP_TIMEOUT = float(os.environ.get("FLEET_TEST_STARTUP_TIMEOUT", "120"))


class RecordingDispatcher:
    """A dispatcher that records what it would send (for tests of the orchestrator alone)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    def send(self, task: str, args: list[Any], queue: str) -> None:
        self.sent.append((task, args, queue))


class WorkerRestarted(UserWarning):
    """A worker a test relied on had died and was started again (the warning says which)."""


#: The worker fleets (``localfleet.fleet.LocalFleet``) the running test relies on, with a label
#: (``"shared"``, a private fleet's name): ``wait_for`` checks their processes while it waits.
_WATCHED: dict[int, tuple[str, Any]] = {}
#: PIDs of workers a test stopped on purpose (their exit is what the test waits for).
_STOPPED_ON_PURPOSE: set[int] = set()


@contextmanager
def watching(fleet: Any, label: str) -> Iterator[None]:
    """While the block runs, a worker of ``fleet`` that dies fails the next ``wait_for``
    at once (``fail_if_a_worker_died``) instead of letting it wait out its timeout."""
    _WATCHED[id(fleet)] = (label, fleet)
    try:
        yield
    finally:
        _WATCHED.pop(id(fleet), None)


def watched_fleets() -> list[tuple[str, Any]]:
    """The watched fleets with their labels."""
    return list(_WATCHED.values())


def stopping_on_purpose(pid: int, sig: signal.Signals) -> None:
    """Record that the test sends ``sig`` to worker ``pid``: if the worker ends, that is the
    test's doing, not a fault to report (SIGSTOP and SIGCONT end nothing)."""
    if sig not in (signal.SIGSTOP, signal.SIGCONT):
        _STOPPED_ON_PURPOSE.add(pid)


def dead_workers(fleet: Any) -> list[Any]:
    """The workers (``WorkerProcess``) of ``fleet`` that exited without a test stopping them."""
    return [
        w
        for w in fleet.workers
        if w.process.poll() is not None and w.process.pid not in _STOPPED_ON_PURPOSE
    ]


def describe_death(label: str, w: Any, lines: int = 20) -> str:
    """``"<family> worker <node> (pid N) of the <label> fleet exited with ..."``
    and the last ``lines`` lines of its log."""
    code = w.process.returncode
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
    try:
        tail = "\n".join(w.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        tail = f"(log unreadable: {exc})"
    return (
        f"{w.family.value} worker {w.node} (pid {w.process.pid}) of the "
        f"{label} fleet exited with {how}; last lines of {w.log_path}:\n{tail}"
    )


def fail_if_a_worker_died(waiting_for: str = "") -> None:
    """Fail the test, naming the worker and quoting its log, if a worker of a watched fleet
    died without the test stopping it (whatever the test waits for will never come)."""
    for label, fleet in list(_WATCHED.values()):
        dead = dead_workers(fleet)
        if dead:
            during = f" while waiting for {waiting_for}" if waiting_for else ""
            pytest.fail(
                f"a worker the test relies on died{during}: {describe_death(label, dead[0])}"
            )


def revive(fleet: Any, label: str, timeout: float = STARTUP_TIMEOUT) -> list[str]:
    """Start a replacement for every worker of ``fleet`` that died without a test stopping it,
    wait for their heartbeats, and warn (``WorkerRestarted``) naming each with its log tail.
    Returns the descriptions of the dead workers (empty when all were alive)."""
    import redis

    from orchestrator.storage.keys import Keys

    dead = dead_workers(fleet)
    if not dead:
        return []
    said = [describe_death(label, w) for w in dead]
    keys, client = Keys(fleet.key_prefix), redis.Redis.from_url(fleet.redis_url)
    try:  # a dead worker's heartbeat must not count as its replacement being ready
        for w in dead:
            client.delete(keys.worker_heartbeat(w.role, w.node))
    finally:
        client.close()
    fleet.restart_dead()
    fleet.wait_ready(timeout)
    for text in said:
        warnings.warn(WorkerRestarted(f"restarted a dead worker: {text}"), stacklevel=2)
    return said


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout``
    seconds, or at once if a worker of a watched fleet died (``fail_if_a_worker_died``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        fail_if_a_worker_died(message)
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def wait_until_up(
    probe: Callable[[], Any],
    proc: subprocess.Popen[Any],
    what: str,
    output: Callable[[], str] = lambda: "",
    timeout: float = STARTUP_TIMEOUT,
    interval: float = 0.1,
) -> Any:
    """Poll ``probe`` until it returns a truthy value (returned) while ``proc`` starts. Fails
    the test at once, quoting ``output()`` (the process's log), if ``proc`` exits first, and
    after ``timeout`` seconds otherwise; ``what`` names the process in the message."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it was up:\n{output()}")
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not up after {timeout:.0f} s:\n{output()}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 (a probe for ``wait_until_up``)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class NoServerErrors(TestClient):
    """A TestClient that fails the test on any 5xx answer (the app's 500s included), except
    on paths starting with one of ``allowed_5xx`` (``/ready`` answers 503 by design)."""

    allowed_5xx: tuple[str, ...] = ()

    def request(self, method: str, url: Any, *args: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        resp = super().request(method, url, *args, **kwargs)
        if not (self.allowed_5xx and str(url).startswith(self.allowed_5xx)):
            assert resp.status_code < 500, (
                f"{method} {url} answered {resp.status_code}: {resp.text}"
            )
        return resp


@contextmanager
def rest_client(
    allowed_5xx: tuple[str, ...] = (),
    *,
    store: Any = None,
    dispatcher: Any = None,
    sse_heartbeat_seconds: float | None = None,
    **env: str,
) -> Iterator[TestClient]:
    """The in-process REST app without a token (unless ``env`` sets one), built for the
    settings ``env`` makes (the domain reads them too, so they stay applied meanwhile), on
    ``store``/``dispatcher`` when given, with heartbeats every ``sse_heartbeat_seconds`` when
    given; a ``NoServerErrors`` client."""
    from api.rest import create_app
    from orchestrator.settings import FleetSettings, get_settings

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLEET_API_TOKEN", raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        get_settings.cache_clear()
        beat = (
            {}
            if sse_heartbeat_seconds is None
            else {"sse_heartbeat_seconds": sse_heartbeat_seconds}
        )
        app = create_app(FleetSettings(), store=store, dispatcher=dispatcher, **beat)
        client = NoServerErrors(app, raise_server_exceptions=False)
        client.allowed_5xx = allowed_5xx
        with client as c:
            yield c
    get_settings.cache_clear()


def error_shape(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Assert the one error shape, ``{"error": {"code", "message", "data"}}``; return it."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "data"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["data"], dict), error
    return error


class FaultyDispatcher:
    """Forwards to a real dispatcher and records what it sent, except tasks in ``drop``
    (a stop message lost on its way) and, while ``broken``, everything (the broker refuses)."""

    def __init__(self, inner: Any, drop: frozenset[str] = frozenset()) -> None:
        self.inner = inner
        self.drop = drop
        self.broken = False
        self.sent: list[tuple[str, list[Any], str]] = []
        self.dropped: list[tuple[str, list[Any], str]] = []

    @property
    def app(self) -> Any:
        return self.inner.app

    def send(self, task: str, args: list[Any], queue: str) -> None:
        if self.broken:
            raise ConnectionError("broker unavailable (injected)")
        if task in self.drop:
            self.dropped.append((task, args, queue))
            return
        self.inner.send(task, args, queue)
        self.sent.append((task, args, queue))

    def sent_for(self, sid: str) -> list[tuple[str, list[Any], str]]:
        return [m for m in self.sent if m[1] and m[1][0] == sid]


#: redis-py's own probe of a connection idle past ``health_check_interval``: not a caller's.
_HEALTH_CHECK = b"*1\r\n$4\r\nPING\r\n"


def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Record every write redis-py makes to a socket in this process from now on (one per
    round trip: a pipeline is one), but its health checks; ``monkeypatch.undo()`` ends it."""
    import redis.connection

    writes: list[bytes] = []
    real: Callable[..., None] = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, bytes | str) else list(command)
        data = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts)
        if data != _HEALTH_CHECK:
            writes.append(data)
        real(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send)
    return writes


def ctrl_c_reaches_it() -> None:
    """A ``preexec_fn`` for a child a test will send SIGINT: SIGINT back to its default, as
    from a terminal. A suite started in the background (``nohup``, ``&`` in a script) ignores
    SIGINT, a child inherits that, and Python then never turns the signal into
    ``KeyboardInterrupt``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def deleted_leftovers(store: Any, ids: set[str]) -> list[str]:
    """What the store under the test prefix still holds of the deleted sessions ``ids``, one
    line each: a key naming one of them other than its record (``Keys.session``, marked
    deleted) and its audit trail (``Keys.audit_log``), both kept by a delete; or a set, sorted
    set or list holding one of them as a member (an index, the archived set, a children set,
    a lineage). Streams (the audit and event logs) and hashes are not read. ``[]``: a delete
    left nothing else behind."""
    kept = {store.keys.session(i) for i in ids} | {store.keys.audit_log(i) for i in ids}
    found: list[str] = []
    names = [
        k
        for k in store.redis.scan_iter(match=f"{store.keys.prefix}*", count=1000)
        if not k.startswith(store.keys.broker_prefix)
    ]
    pipe = store.redis.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    members = sorted(ids)
    probes = store.redis.pipeline(transaction=False)
    probed: list[tuple[str, str]] = []
    for name, kind in zip(names, pipe.execute(), strict=True):
        if any(i in name for i in ids) and name not in kept:
            found.append(f"key {name}")
        if kind == "set":
            probes.smismember(name, members)
        elif kind == "zset":
            probes.zmscore(name, members)
        elif kind == "list":
            for i in members:
                probes.lpos(name, i)
        else:
            continue
        probed.append((name, kind))
    replies = iter(probes.execute())
    for name, kind in probed:
        if kind == "list":
            hits = [i for i in members if next(replies) is not None]
        elif kind == "zset":
            hits = [i for i, score in zip(members, next(replies), strict=True) if score is not None]
        else:
            hits = [i for i, held in zip(members, next(replies), strict=True) if held]
        found.extend(f"{kind} {name} holds {i}" for i in hits)
    return found
