"""How many gate checks and archives one Redis primary sustains: ``python -m bench.capacity
[--seconds S] [--clients C]``.

Starts a private embedded Redis (append-only, ``appendfsync always``, as production should
run it), seeds 2,000 sessions, then runs two phases of ``--seconds`` each with ``--clients``
client processes hammering it:

* **gate**: ``gate.admit`` on random sessions (one ``gate_admit`` script per call, what every
  model step costs);
* **archive**: ``archive.archive`` then ``archive.unarchive`` on random idle sessions (the
  durable lifecycle path, census included, with no stop messages to send).

* **steps**: real turns on one real turn worker (``say hello`` steps of the scripted model):
  everything a model step costs the primary, the Celery broker's commands and task events
  included.

For each phase it prints the calls per second the clients achieved, the server's CPU seconds
per call (``INFO cpu`` delta / calls: what the single-threaded primary spends, fsync syscalls
included) and so the calls per second one fully busy primary core would sustain
(``1 / cpu per call``), and the server's own time per script (``INFO commandstats``).
On a small machine the clients compete with the server for cores, so the achieved rate is a
floor; the per-call server cost is what extrapolates.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

PREFIX = "cap:"
SESSIONS = 2000


class _Null:
    def send(self, task: str, args: list[Any], queue: str) -> None:
        return None


def _client(url: str, phase: str, ids: list[str], seconds: float, counter: Any) -> None:
    from orchestrator.archiving import archive
    from orchestrator.session import gate
    from orchestrator.storage.store import Store

    store = Store(url, PREFIX, min_replicas_ack=0)
    rng = random.Random()
    done = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sid = rng.choice(ids)
        if phase == "gate":
            with contextlib.suppress(gate.StepRefused):
                gate.admit(store, sid)
            done += 1
        else:
            archive.archive(store, _Null(), sid)
            archive.unarchive(store, sid)
            done += 2
    with counter.get_lock():
        counter.value += done


def _cpu(raw: Any) -> float:
    info = raw.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def phase(url: str, name: str, ids: list[str], seconds: float, clients: int) -> dict[str, Any]:
    raw = redis.Redis.from_url(url, decode_responses=True)
    raw.config_resetstat()
    counter: Any = multiprocessing.Value("l", 0)
    cpu0, t0 = _cpu(raw), time.perf_counter()
    procs = [
        multiprocessing.Process(target=_client, args=(url, name, ids, seconds, counter))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall, cpu = time.perf_counter() - t0, _cpu(raw) - cpu0
    calls = int(counter.value)
    stats = raw.info("commandstats")
    scripts = stats.get("cmdstat_evalsha", {})
    return {
        "phase": name,
        "calls": calls,
        "callsPerSecond": round(calls / wall),
        "serverCpuUsPerCall": round(cpu / max(calls, 1) * 1e6, 1),
        "callsPerSecondPerPrimaryCore": round(calls / cpu) if cpu else None,
        "evalshaUsPerCall": scripts.get("usec_per_call"),
        "redisCommandsPerCall": round(
            sum(int(v["calls"]) for v in stats.values()) / max(calls, 1), 1
        ),
    }


def steps_phase(url: str, root: Path, turns_n: int = 20, steps_n: int = 50) -> dict[str, Any]:
    """Run ``turns_n`` turns of ``steps_n`` steps on one turn worker; server cost per step."""
    from api.wiring import celery_dispatcher
    from localfleet.fleet import LocalFleet
    from orchestrator.families import Family
    from orchestrator.session import sessions
    from orchestrator.settings import FleetSettings
    from orchestrator.storage.store import Store
    from orchestrator.turn import turns

    settings = FleetSettings(redis_url=url, key_prefix=PREFIX, redis_min_replicas_ack=0)
    dispatcher = celery_dispatcher(settings)
    store = Store(url, PREFIX, settings=settings)
    fleet = LocalFleet(url, PREFIX, root, hostname="cap", concurrency=8).start([Family.TURN])
    try:
        fleet.wait_ready(60)
        raw = redis.Redis.from_url(url, decode_responses=True)
        raw.config_resetstat()
        cpu0, t0 = _cpu(raw), time.perf_counter()
        prompt = "\n".join(["say hello"] * steps_n)
        ids = []
        for _ in range(turns_n):
            sid = sessions.create_session(store, "/bench/capacity").session_id
            ids.append((sid, turns.start_turn(store, dispatcher, sid, prompt)))
        for _sid, tid in ids:
            while (turn := turns.get_turn(store, tid)) is None or turn.state.value in (
                "queued",
                "running",
            ):
                time.sleep(0.05)
        wall, cpu = time.perf_counter() - t0, _cpu(raw) - cpu0
        done = sum(int(raw.llen(store.keys.model_requests(sid))) for sid, _ in ids)
        stats = raw.info("commandstats")
        return {
            "phase": "steps",
            "steps": done,
            "stepsPerSecondOneWorker": round(done / wall),
            "serverCpuUsPerStep": round(cpu / max(done, 1) * 1e6, 1),
            "stepsPerSecondPerPrimaryCore": round(done / cpu) if cpu else None,
            "redisCommandsPerStep": round(
                sum(int(v["calls"]) for v in stats.values()) / max(done, 1), 1
            ),
            # Server time per step by command (scripts' inner commands are inside evalsha).
            "usPerStepByCommand": {
                name.removeprefix("cmdstat_"): round(int(v["usec"]) / max(done, 1), 1)
                for name, v in sorted(stats.items(), key=lambda kv: -int(kv[1]["usec"]))[:8]
            },
        }
    finally:
        fleet.stop(timeout=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    from localfleet.embedded import EmbeddedRedis
    from orchestrator.session import sessions
    from orchestrator.storage.store import Store

    with EmbeddedRedis(Path(tempfile.mkdtemp(prefix="fleet-capacity-"))) as server:
        store = Store(server.url, PREFIX, min_replicas_ack=0)
        ids = [
            sessions.create_session(store, "/bench/capacity").session_id for _ in range(SESSIONS)
        ]
        for name in ("gate", "archive"):
            print(phase(server.url, name, ids, args.seconds, args.clients), flush=True)
        print(steps_phase(server.url, Path(tempfile.mkdtemp(prefix="fleet-capacity-"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
