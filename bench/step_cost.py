"""Benchmark 13: what one model step costs Redis, and its wall time through the fleet.

Every figure comes from a private ``redis-server`` (``api/embedded.py``) serving one host's
turn workers (a turn worker and its control-only one, as ``fleet up`` starts them) and nothing
else, so ``INFO commandstats`` counts exactly what the fleet sends:

* **commands per one-step turn**: ``n`` turns of the ``scripted`` model's ``say hello``, one
  after the other, from ``turns.start_turn`` (the turn's store and its first step's message)
  to the turn's end, Celery's commands included (the broker's message, its delivery and
  acknowledgement, the task events); the idle fleet's rate, measured over as long with no
  work, is subtracted. The caller waits for each turn's end on the events channel (one
  ``SUBSCRIBE``, not counted), and ``INFO`` itself is not counted;
* **idle commands per second**: the same host's workers running with no work;
* **fleet/direct ratio**: the median wall time of a one-step turn through the fleet (from
  ``start_turn`` to its ``turn`` event) over the median of the same step's minimal Redis work
  done directly: the **direct** step is one ``EVAL`` that appends the answer to the session's
  conversation, publishes it and ends the turn (the least a step must write, fsynced once),
  plus one ``LPUSH`` of a message and the ``BRPOP`` that takes it (the least a hand-off to a
  worker costs), all from one client. Measured at ``appendfsync always`` and ``everysec``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import Row, ms

#: Commands the measuring client sends itself (never the fleet's).
_OWN = frozenset({"info", "subscribe", "unsubscribe", "config|set", "config", "ping"})

#: The prompt of the one-step turn measured.
PROMPT = "say hello"

_DIRECT = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PUBLISH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], 'state', 'completed')
return 1
"""


def commandstats(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the server started (``INFO commandstats``), but the
    measuring client's own (``_OWN``)."""
    stats: dict[str, Any] = client.info("commandstats")
    out = {}
    for name, fields in stats.items():
        command = name.removeprefix("cmdstat_")
        if command not in _OWN:
            out[command] = int(fields["calls"])
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls per command between two ``commandstats`` readings (commands with none left out)."""
    out = {name: calls - before.get(name, 0) for name, calls in after.items()}
    return {name: calls for name, calls in out.items() if calls}


@dataclass
class StepCost:
    """What ``n`` one-step turns cost, the idle rate already subtracted: ``per_turn``
    commands (``by_command``: per command name), ``idle_per_second`` of the fleet at rest,
    and each turn's wall time (seconds)."""

    n: int
    per_turn: float
    by_command: dict[str, float]
    idle_per_second: float
    walls: list[float]


class TurnFleet:
    """One host's turn workers on a private server, and the store and dispatcher of their
    prefix."""

    def __init__(self, url: str, prefix: str, state: Path, families: list[str] | None = None):
        from bench.common import configure
        from localfleet.fleet import LocalFleet
        from orchestrator.families import Family

        self.url = url
        self.store, self.dispatcher = configure(url, prefix)
        self.raw = redis.Redis.from_url(url, decode_responses=True)
        self.fleet = LocalFleet(url, prefix, state, hostname="stepcost")
        self.fleet.start(families or [Family.TURN])
        self.sid = ""

    def close(self) -> None:
        self.fleet.stop()
        self.raw.close()
        self.store.close()

    def turns(self, n: int) -> list[float]:
        """Run ``n`` one-step turns one after the other; each one's wall time (seconds)."""
        from orchestrator.session import sessions
        from orchestrator.turn import turns

        if not self.sid:  # one session for every turn, created before any is measured
            self.sid = sessions.create_session(self.store, "/bench/step").session_id
        sid = self.sid
        pubsub = self.raw.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.store.keys.events)
        walls = []
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                tid = turns.start_turn(self.store, self.dispatcher, sid, PROMPT)
                _wait_end(pubsub, tid)
                walls.append(time.perf_counter() - t0)
        finally:
            pubsub.close()
        return walls

    def idle_rate(self, seconds: float) -> float:
        """The fleet's commands per second with no work, over ``seconds``."""
        by_command, _ = self.idle_by_command(seconds)
        return sum(by_command.values())

    def idle_by_command(self, seconds: float) -> tuple[dict[str, float], float]:
        """The fleet's commands per second with no work over ``seconds``, per command; and
        the seconds measured."""
        before = commandstats(self.raw)
        t0 = time.perf_counter()
        time.sleep(seconds)
        took = time.perf_counter() - t0
        return {k: v / took for k, v in delta(before, commandstats(self.raw)).items()}, took

    def cost(self, n: int) -> StepCost:
        """``n`` one-step turns measured (after two to warm up), the idle rate measured
        over as long just after and subtracted."""
        self.turns(2)
        before = commandstats(self.raw)
        t0 = time.perf_counter()
        walls = self.turns(n)
        took = time.perf_counter() - t0
        used = delta(before, commandstats(self.raw))
        idle = self.idle_rate(max(took, 3.0))
        per_turn = (sum(used.values()) - idle * took) / n
        by_command = {name: calls / n for name, calls in sorted(used.items())}
        return StepCost(n, per_turn, by_command, idle, walls)


def _wait_end(pubsub: Any, tid: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=1.0)
        if msg is None:
            continue
        event = json.loads(msg["data"])
        if event.get("type") == "turn" and event.get("turnId") == tid:
            assert event["state"] == "completed", event
            return
    raise TimeoutError(f"turn {tid} did not end within {timeout} s")


@contextlib.contextmanager
def turn_fleet(families: list[str] | None = None) -> Iterator[TurnFleet]:
    """A private ``redis-server`` (``appendfsync always``) and one host's turn workers (or
    its workers of ``families``) on it, stopped after."""
    from localfleet.embedded import EmbeddedRedis

    state = Path(tempfile.mkdtemp(prefix="fleet-stepcost-"))
    with EmbeddedRedis(state / "redis") as server:
        fleet = TurnFleet(server.url, f"stepcost-{uuid.uuid4().hex[:6]}:", state, families)
        try:
            fleet.fleet.wait_ready(90)
            yield fleet
        finally:
            fleet.close()


def _direct_walls(url: str, n: int) -> list[float]:
    """``n`` direct steps (the module docstring): one message handed over by ``LPUSH`` and
    ``BRPOP``, then one script appending the answer, publishing it and ending the turn."""
    client = redis.Redis.from_url(url)
    script = client.register_script(_DIRECT)
    keys = ["direct:history", "direct:events", "direct:turn"]
    answer = json.dumps({"sessionUpdate": "agent_message_chunk", "content": {"text": "hello"}})
    walls = []
    try:
        for _ in range(n + 2):
            t0 = time.perf_counter()
            client.lpush("direct:queue", "step")
            client.brpop(["direct:queue"], 1)
            script(keys=keys, args=[answer])
            walls.append(time.perf_counter() - t0)
        client.delete("direct:queue", *keys)
    finally:
        client.close()
    return walls[2:]


def bench_step_cost(n: int) -> list[Row]:
    """Benchmark 13 with ``n`` turns per figure (its own private server: the figures need a
    server no one else uses)."""
    rows: list[Row] = []
    with turn_fleet() as tf:
        cost = tf.cost(n)
        top = sorted(cost.by_command.items(), key=lambda kv: -kv[1])[:6]
        rows.append(
            (
                "13 Redis commands per one-step turn (turn worker + its control worker; idle "
                "subtracted)",
                f"n={n}",
                f"{cost.per_turn:.1f} commands ("
                + ", ".join(f"{name} {calls:.1f}" for name, calls in top)
                + ")",
                "goal <= 40: " + ("met" if cost.per_turn <= 40 else "MISSED"),
            )
        )
        rows.append(
            (
                "13 idle, one host's turn workers",
                "no work",
                f"{cost.idle_per_second:.1f} commands/s",
                "lower is better",
            )
        )
        for fsync, goal in (("always", 3.0), ("everysec", 1.5)):
            tf.raw.config_set("appendfsync", fsync)
            fleet_walls = tf.turns(n)
            direct = statistics.median(_direct_walls(tf.url, n))
            med = statistics.median(fleet_walls)
            ratio = med / direct
            rows.append(
                (
                    f"13 one-step turn through the fleet vs direct, appendfsync {fsync}",
                    f"n={n}",
                    f"median {ms(med)} (direct {ms(direct)})",
                    f"{ratio:.2f}x direct; goal <= {goal}x: "
                    + ("met" if ratio <= goal else "MISSED"),
                )
            )
        tf.raw.config_set("appendfsync", "always")
    from orchestrator.families import names

    with turn_fleet(names()) as host:
        time.sleep(2)  # past the workers' start-up
        idle, seconds = host.idle_by_command(10.0)
    top = sorted(idle.items(), key=lambda kv: -kv[1])[:5]
    rows.append(
        (
            "13 idle, one host's workers of every family (turn, job, subagent, reminder and "
            "their control workers)",
            f"{seconds:.0f} s, no work",
            f"{sum(idle.values()):.1f} commands/s ("
            + ", ".join(f"{name} {rate:.1f}" for name, rate in top)
            + ")",
            "lower is better",
        )
    )
    return rows
