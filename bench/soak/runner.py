"""One soak, start to finish: processes up, traffic and faults for the fault phase, every
fault released, a settle window (with a probe that every family consumes again), then the
checks, then everything stopped."""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bench.soak import checks
from bench.soak.escapes import Escapes
from bench.soak.evidence import gather
from bench.soak.faults import Faults
from bench.soak.procs import Processes
from bench.soak.traffic import Traffic

PROBE = "say probe\nrun 1\nremind 1 say PROBE\nspawn say probe-child"


@dataclass
class Config:
    """What to run: fault phase length (s), seed, population, client threads, settle window
    (s) and where to keep state (a temporary directory, removed after a clean run unless
    ``keep``; kept, with every log, when a check found violations)."""

    seconds: float
    seed: int = 1
    sessions: int = 24
    concurrency: int = 4
    settle: float = 60.0
    state_dir: Path | None = None
    keep: bool = False


@dataclass
class Result:
    """Checks, traffic and fault counts, timings."""

    config: Config
    checks: list[checks.Check] = field(default_factory=list)
    traffic: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    state_dir: str = ""

    @property
    def violations(self) -> int:
        return sum(c.violations for c in self.checks)


def say(text: str) -> None:
    print(f"soak: {text}", file=sys.stderr, flush=True)


class Probe:
    """A fresh session exercising every family after the faults: it passes once its turn,
    its reminder's turn and its subagent's report turn completed and its job ended."""

    def __init__(self, procs: Processes, traffic: Traffic) -> None:
        self.procs, self.traffic = procs, traffic
        self.sid: str | None = None

    def start(self, client: httpx.Client, until: float) -> None:
        while self.sid is None and time.monotonic() < until:
            self.sid = self.traffic.create(client)
            if self.sid:
                r = self.traffic.call(
                    client,
                    "probe",
                    [self.sid],
                    "POST",
                    f"/sessions/{self.sid}/prompt",
                    {"prompt": PROBE},
                )
                if r.status != 202:
                    self.sid = None
            if self.sid is None:
                time.sleep(0.5)

    def passed(self, store: redis.Redis, prefix: str) -> bool:
        if self.sid is None:
            return False
        try:
            if store.scard(f"{prefix}jobs:live:{self.sid}"):
                return False
            done = 0
            for key in store.scan_iter(match=f"{prefix}turn:turn_*", count=2000):
                h = store.hmget(key, "sessionId", "state")
                done += h[0] == self.sid and h[1] == "completed"
            return done >= 3
        except redis.RedisError:
            return False


def _settled(store: redis.Redis, prefix: str) -> bool:
    """No turn is live and no reminder is armed."""
    try:
        if store.zcard(f"{prefix}reminders:due"):
            return False
        for key in store.scan_iter(match=f"{prefix}turns:live:*", count=2000):
            if store.zcard(key):
                return False
        return True
    except redis.RedisError:
        return False


def settle(procs: Processes, traffic: Traffic, seconds: float) -> bool:
    """Wait until everything is final and the probe passed, at most ``seconds``; whether
    the probe passed."""
    until = time.monotonic() + seconds
    probe = Probe(procs, traffic)
    store = redis.Redis.from_url(procs.redis.url, decode_responses=True, socket_timeout=5)
    try:
        with httpx.Client(base_url=procs.base_url, timeout=10) as client:
            probe.start(client, until)
        while time.monotonic() < until:
            ok = probe.passed(store, procs.prefix)
            if ok and _settled(store, procs.prefix):
                return True
            time.sleep(1.0)
        return probe.passed(store, procs.prefix)
    finally:
        store.close()


def run(cfg: Config) -> Result:
    """Run one soak (see the module docstring). Raises ``RuntimeError`` if the processes
    cannot be started."""
    result = Result(cfg)
    state = cfg.state_dir or Path(tempfile.mkdtemp(prefix="fleet-soak-"))
    result.state_dir = str(state)
    token = secrets.token_hex(16)
    procs = Processes(state, token)
    watching = threading.Event()
    t0 = time.monotonic()
    try:
        procs.start()
        procs.watch(watching)
        result.timings["startup_s"] = time.monotonic() - t0
        say(
            f"up in {result.timings['startup_s']:.1f}s (state in {state}); "
            f"{cfg.seconds:g}s of traffic and faults, seed {cfg.seed}"
        )
        traffic = Traffic(procs.base_url, token, cfg.seed, cfg.sessions, cfg.concurrency)
        with httpx.Client(base_url=procs.base_url, timeout=10) as client:
            traffic.setup(client)
        escapes = Escapes(traffic)
        faults = Faults(procs, cfg.seed, during_freeze=traffic.archive_busy, escape=escapes)
        until = time.monotonic() + cfg.seconds
        injector = threading.Thread(target=faults.run, args=(until,), name="soak-faults")
        injector.start()
        traffic.run(until)
        faults.stop()
        injector.join()
        faults.release_all()
        stopped = time.monotonic()
        say(
            f"faults stopped ({sum(faults.log.counts().values())} injected); settling "
            f"(at most {cfg.settle:g}s)"
        )
        probe_ok = settle(procs, traffic, cfg.settle)
        result.timings["settle_s"] = time.monotonic() - stopped
        ev = gather(procs.redis.url, procs.prefix, procs.log_paths(), procs.base_url, token)
        watching.set()
        calls = [c for c in traffic.log.calls if c.op != "probe"]
        result.checks = [
            checks.late_model_requests(calls, ev),
            checks.reminders(ev, time.time() * 1000),
            checks.stuck_turns(ev, cfg.settle),
            checks.exits(procs.exits),
            checks.server_errors(traffic.log.calls),
            checks.metrics_and_audit(calls, ev),
            escapes.check(),
            checks.Check(
                "families consuming after recovery (probe)",
                0 if probe_ok else 1,
                "a new session's turn, job, reminder and subagent all completed"
                if probe_ok
                else "the probe session did not complete within the settle window",
            ),
        ]
        result.traffic = _traffic_counts(traffic)
        result.faults = faults.log.counts()
        if faults.log.skipped:
            result.faults["skipped"] = faults.log.skipped
    finally:
        watching.set()
        procs.stop()
        result.timings["total_s"] = time.monotonic() - t0
        if cfg.state_dir is None and not cfg.keep and not result.violations:
            shutil.rmtree(state, ignore_errors=True)
    return result


def _traffic_counts(traffic: Traffic) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in traffic.log.calls:
        key = f"{c.op} {c.status if c.status is not None else 'no answer'}"
        out[key] = out.get(key, 0) + 1
    out["sessions"] = len(traffic.sessions)
    return dict(sorted(out.items()))
