"""Archives through a Sentinel failover: ``python -m bench.failover [--ack N]
[--lag-ms MS] [--hang] [--runs R]``.

Starts on loopback a primary, two replicas and three Sentinels (``bench/sentinels.py``), one
worker per family, ``fleet beat`` and the API, all pointed at the Sentinels. Client threads
loop: create a session, start a long turn (a busy session), wait for its first model request,
archive it with ``stopActivity`` (retrying a 503 until it answers 200). Mid-loop the primary
is SIGKILLed by PID (with ``--hang``, SIGSTOPped: its connections stay open and silent, as a
hung host's, and every process must notice by itself). With ``--lag-ms`` the replicas are
first made to fall behind for that long (stopped, their links closed on the primary: what a
slow or broken replication link does) while six more busy sessions are archived, then the
primary is killed and the replicas continued. Sentinel promotes a replica and the loop goes
on.

Then it checks, on the new primary: every archive answered 200 is archived there (``lost``
counts those that are not), no model request of an archived session was admitted after its
archive was answered, every turn of those sessions is final, no fleet process exited, a new
turn on a new session completes; and it reports the time from the kill to the first 200 of
an archive sent after it. ``tests/faults/test_failover.py`` runs it with
``FLEET_REDIS_MIN_REPLICAS_ACK=1`` and asserts zero; this script prints the figures for
either setting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import free_port
from bench.sentinels import SentinelGroup, sentinel_group
from localfleet.fleet import LocalFleet
from orchestrator.errors import StoreUnavailable
from orchestrator.process.processes import die_with_parent
from orchestrator.storage.redisconn import SentinelOptions
from orchestrator.storage.store import Store, iso
from orchestrator.turn import turns

PREFIX = "fo:"
#: A turn that keeps its session busy for the whole run (each line is one model step).
BUSY_PROMPT = "\n".join(["say hello"] * 400)
#: Busy sessions archived while the replicas are behind (``--lag-ms``).
BURST = 6
FINAL = {s.value for s in turns.TurnState} - {"queued", "running", "cancelling"}


@dataclass
class Answer:
    """One archive request: session, HTTP status (0: no answer), error code, times (s)."""

    sid: str
    status: int
    code: str
    sent: float
    answered: float


@dataclass
class Outcome:
    """What one run saw; ``violations`` is empty when every check held."""

    acknowledged: int = 0
    lost: list[str] = field(default_factory=list)
    late_requests: list[str] = field(default_factory=list)
    not_final: list[str] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    kill_to_first_archive_s: float | None = None
    promoted_after_s: float | None = None
    new_turn_completed: bool = False
    #: Refusals met while creating that new turn (retried; see ``_new_turn_completes``).
    refusals: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        found = [f"lost archive {sid}" for sid in self.lost]
        found += self.late_requests + self.not_final + self.exits
        if not self.new_turn_completed:
            found.append(
                f"a new turn did not complete after the failover (refusals: {self.refusals[-3:]})"
            )
        return found


class Client:
    """The API's loop of busy-session archives, on ``threads`` threads."""

    def __init__(self, base: str, store: Store, threads: int) -> None:
        self.base, self.store, self.threads = base, store, threads
        self.answers: list[Answer] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def acknowledged(self, since: float = 0.0) -> int:
        with self.lock:
            return sum(1 for a in self.answers if a.status == 200 and a.sent >= since)

    def _call(self, http: httpx.Client, method: str, path: str, body: Any = None) -> Any:
        """A request retried until it answers 2xx (503 and lost connections are the
        failover); returns the JSON body, or None when the run ends first."""
        while not self.done.is_set():
            with contextlib.suppress(httpx.HTTPError):
                resp = http.request(method, self.base + path, json=body)
                if resp.status_code < 300:
                    return resp.json()
                if resp.status_code == 404:  # a session whose creation the failover lost
                    return None
                if resp.status_code != 503:
                    raise AssertionError(f"{method} {path}: {resp.status_code} {resp.text}")
            time.sleep(0.1)
        return None

    def _requested(self, sid: str) -> bool:
        try:
            return bool(self.store.redis.llen(self.store.keys.model_requests(sid)))
        except Exception:
            return False

    def _archive(self, http: httpx.Client, sid: str) -> None:
        while not self.done.is_set():
            sent = time.time()
            try:
                resp = http.post(f"{self.base}/sessions/{sid}/archive", json={"stopActivity": True})
                status = resp.status_code
                code = resp.json().get("error", {}).get("code", "") if status != 200 else ""
            except httpx.HTTPError as exc:
                status, code = 0, type(exc).__name__
            with self.lock:
                self.answers.append(Answer(sid, status, code, sent, time.time()))
            if status == 200 or status == 404:  # 404: its creation was lost in the failover
                return
            if status != 503 and status != 0:
                raise AssertionError(f"archive {sid}: {status} {code}")
            time.sleep(0.05)

    def busy_session(self) -> str:
        """A new session with a long turn whose first model request was made."""
        with httpx.Client(timeout=10) as http:
            created = self._call(http, "POST", "/sessions", {"cwd": "/tmp/failover"})
            if created is None:
                raise RuntimeError("no session could be created")
            sid: str = created["sessionId"]
            self._call(http, "POST", f"/sessions/{sid}/prompt", {"prompt": BUSY_PROMPT})
        deadline = time.monotonic() + 20
        while not self._requested(sid) and time.monotonic() < deadline:
            time.sleep(0.02)
        return sid

    def probe(self, sid: str) -> None:
        """Archive ``sid`` until it answers 200 (every answer recorded)."""
        with httpx.Client(timeout=10) as http:
            self._archive(http, sid)

    def loop(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self.done.is_set():
                created = self._call(http, "POST", "/sessions", {"cwd": "/tmp/failover"})
                if created is None:
                    return
                sid = created["sessionId"]
                if self._call(http, "POST", f"/sessions/{sid}/prompt", {"prompt": BUSY_PROMPT}):
                    deadline = time.monotonic() + 10
                    while not self._requested(sid) and time.monotonic() < deadline:
                        time.sleep(0.02)
                self._archive(http, sid)

    def run(self) -> list[threading.Thread]:
        found = [threading.Thread(target=self.loop, daemon=True) for _ in range(self.threads)]
        for t in found:
            t.start()
        return found


@contextlib.contextmanager
def fleet_processes(group: SentinelGroup, root: Path, env: dict[str, str]) -> Iterator[Any]:
    """Workers (one per family), beat and the API on the group; yields (fleet, api, beat,
    base URL)."""
    full = {**group.env(), "FLEET_KEY_PREFIX": PREFIX, **env}
    fleet = LocalFleet(group.url, PREFIX, root, hostname="fo", concurrency=4, extra_env=full)
    port = free_port()
    penv = {**os.environ, **full, "FLEET_STATE_DIR": str(root)}
    py = sys.executable
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        fleet.start()
        for name, cmd in [
            ("api", ["api", "--host", "127.0.0.1", "--port", str(port)]),
            ("beat", ["beat", "--schedule-file", str(root / "beat.db")]),
        ]:
            with open(logs / f"{name}.log", "ab") as out:
                helpers.append(
                    subprocess.Popen(
                        [py, "-m", "api.cli", *cmd],
                        env=penv,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        preexec_fn=die_with_parent(signal.SIGKILL, new_session=False),
                    )
                )
        fleet.wait_ready(90)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError((logs / "api.log").read_text())
            time.sleep(0.1)
        yield fleet, helpers[0], helpers[1], base
    finally:
        for proc in helpers:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(8)
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        fleet.stop(timeout=8)


def _exits(fleet: LocalFleet, api: Any, beat: Any) -> list[str]:
    found = [
        f"worker {w.family.value}@{w.host} exited ({w.process.returncode})"
        for w in fleet.workers
        if w.process.poll() is not None
    ]
    found += [f"{n} exited ({p.returncode})" for n, p in [("api", api), ("beat", beat)] if p.poll()]
    return found


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(StoreUnavailable):
            if predicate():
                return True
        time.sleep(0.2)
    return False


def _turn_states(store: Store, sid: str) -> list[str]:
    raw = store.redis.lrange(store.keys.model_requests(sid), 0, -1)
    found = (turns.get_turn(store, t) for t in {json.loads(r)["turnId"] for r in raw})
    return [t.state.value if t else "missing" for t in found]


def check(store: Store, client: Client, kill_at: float, out: Outcome) -> None:
    """Fill ``out`` from the store (the new primary) and the client's answers."""
    acked: dict[str, float] = {}
    for a in client.answers:
        key = str(a.status) + (f" {a.code}" if a.code else "")
        out.statuses[key] = out.statuses.get(key, 0) + 1
        if a.status == 200:
            acked.setdefault(a.sid, a.answered)
    out.acknowledged = len(acked)
    after = [a.answered for a in client.answers if a.status == 200 and a.sent >= kill_at]
    # The probe's first request is sent at once after the kill; its 200 is among these.
    out.kill_to_first_archive_s = round(min(after) - kill_at, 3) if after else None
    k = store.keys
    for sid, answered in acked.items():
        if store.redis.hget(k.session(sid), "archived") != "1":
            out.lost.append(sid)
        # Redis's clock and this process's are the same machine's here.
        answered_iso = iso(int(answered * 1000))
        for raw in store.redis.lrange(k.model_requests(sid), 0, -1):
            at = json.loads(raw)["at"]
            if at > answered_iso:
                out.late_requests.append(f"{sid}: model request at {at} after its 200")
    for sid in acked:
        if not _wait(lambda s=sid: all(x in FINAL for x in _turn_states(store, s)), 60):
            out.not_final.append(f"{sid}: turns {_turn_states(store, sid)} not final")


def _post_until_accepted(
    http: httpx.Client, url: str, body: dict[str, Any], field: str, out: Outcome
) -> str | None:
    """POST ``body`` to ``url`` until it is answered 2xx (60 s at most); returns the answer's
    ``field``. Each refusal is kept in ``out.refusals``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = http.post(url, json=body)
        if answer.is_success:
            return str(answer.json()[field])
        out.refusals.append(f"POST {url}: {answer.status_code} {answer.text[:200]}")
        time.sleep(0.5)
    return None


def _new_turn_completes(base: str, out: Outcome) -> bool:
    """Whether a new session's first turn completes after the failover. Its creation and
    prompt are retried: a refusal while the promoted primary's replicas catch up (503) is a
    write the fleet would not confirm, not a lost one."""
    with httpx.Client(timeout=10) as http:
        sid = _post_until_accepted(
            http, base + "/sessions", {"cwd": "/tmp/failover"}, "sessionId", out
        )
        if sid is None:
            return False
        prompt = {"prompt": "say hi"}
        tid = _post_until_accepted(http, f"{base}/sessions/{sid}/prompt", prompt, "turnId", out)
        if tid is None:
            return False
        return _wait(lambda: http.get(f"{base}/turns/{tid}").json()["state"] == "completed", 60)


def run(
    root: Path,
    *,
    ack: int,
    lag_ms: int = 0,
    before: int = 12,
    after: int = 12,
    hang: bool = False,
) -> Outcome:
    """One run under ``root``: ``before`` archives acknowledged before the kill, ``after``
    archives sent after it. With ``hang`` the primary is SIGSTOPped instead of killed (its
    connections stay open and silent, as a hung host's) until the run ends. Returns what it
    saw."""
    env = {
        "FLEET_REDIS_MIN_REPLICAS_ACK": str(ack),
        "FLEET_VISIBILITY_TIMEOUT_SECONDS": "10",
        "FLEET_TURN_STUCK_SECONDS": "5",
        "FLEET_RECONCILE_GRACE_SECONDS": "1",
        "FLEET_RECONCILE_INTERVAL_SECONDS": "2",
        "FLEET_LOG_FORMAT": "text",
    }
    out = Outcome()
    with sentinel_group(root / "redis") as group, fleet_processes(group, root, env) as procs:
        fleet, api, beat, base = procs
        store = Store(group.url, PREFIX, sentinel=SentinelOptions(group.master), min_replicas_ack=0)
        client = Client(base, store, threads=3)
        threads = client.run()
        try:
            if not _wait(lambda: client.acknowledged() >= before, 120):
                raise RuntimeError("the loop did not get going")
            probe = client.busy_session()
            burst = None
            if lag_ms:
                pool = [client.busy_session() for _ in range(BURST)]
                group.cut_replication()
                burst = threading.Thread(target=lambda: [client.probe(s) for s in pool])
                burst.start()
                time.sleep(lag_ms / 1000)  # the window in which replicas are behind
            kill_at = time.time()
            old = hung = group.hang_primary() if hang else group.kill_primary()
            if lag_ms:
                group.signal_replicas(signal.SIGCONT)
            # The time to the first acknowledged archive: one sent right after the kill.
            client.probe(probe)
            if burst is not None:
                burst.join(120)
            group.wait_promoted(old)
            out.promoted_after_s = round(time.time() - kill_at, 3)
            _wait(lambda: client.acknowledged(since=kill_at) >= after, 120)
        finally:
            client.done.set()
            for t in threads:
                t.join(30)
        try:
            check(store, client, kill_at, out)
            out.new_turn_completed = _new_turn_completes(base, out)
            out.exits = _exits(fleet, api, beat)
        finally:
            if hang and hung.alive:
                hung.process.send_signal(signal.SIGCONT)
            store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    parser.add_argument("--ack", type=int, default=1, help="FLEET_REDIS_MIN_REPLICAS_ACK")
    parser.add_argument("--lag-ms", type=int, default=0, help="replicas stopped before the kill")
    parser.add_argument(
        "--hang", action="store_true", help="SIGSTOP the primary instead of killing it"
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--dir", default="", help="working directory (default: a temp dir)")
    args = parser.parse_args(argv)
    import tempfile

    failed = 0
    for i in range(args.runs):
        root = Path(args.dir or tempfile.mkdtemp(prefix="failover-")) / f"run{i}"
        out = run(root, ack=args.ack, lag_ms=args.lag_ms, hang=args.hang)
        print(
            json.dumps(
                {
                    "ack": args.ack,
                    "lagMs": args.lag_ms,
                    "hang": args.hang,
                    "acknowledged": out.acknowledged,
                    "lost": len(out.lost),
                    "lateModelRequests": len(out.late_requests),
                    "notFinal": len(out.not_final),
                    "exits": out.exits,
                    "statuses": out.statuses,
                    "promotedAfterS": out.promoted_after_s,
                    "killToFirstArchiveS": out.kill_to_first_archive_s,
                    "newTurnCompleted": out.new_turn_completed,
                    "newTurnRefusals": out.refusals[-3:],
                }
            ),
            flush=True,
        )
        failed += bool(out.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
