"""Benchmark 14: an external agent's prompt through the fleet vs the same agent driven
directly over ACP, and how soon an archive leaves nothing of the agent running.

The agent is the project's tiny ACP agent (``tests/agents/tiny_agent.py``). The fleet keeps a
session's agent process between its prompts (``orchestrator/agents/pool.py``), so each side is
measured both ways:

* **kept process**: direct, one agent process and session, ``n`` prompts; through the fleet,
  ``n`` prompts of one session (its agent started by the first, two warm-up prompts not
  counted): time to the first ``agent_message_chunk`` and to the prompt's answer (the
  turn's ``turn`` event on the events channel);
* **first prompt** (the agent started for it): direct, the SDK spawns the agent,
  ``initialize``, ``session/new``, ``session/prompt``; through the fleet, a new session's
  first prompt;
* **archive -> tree gone**: a prompt running ``sleep``, archived with ``stopActivity``; the
  time from the archive's answer until no process of the agent's command is left (looked at
  every millisecond).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import Row, ms, pct

TINY = Path(__file__).resolve().parent.parent / "tests" / "agents" / "tiny_agent.py"


def _toml() -> str:
    return f'[agents.tiny]\npreset = "acp"\ncommand = ["{sys.executable}", "{TINY}"]\n' + (
        'permissions = "allow"\n'
    )


def _as_client(client: Any) -> Any:
    """``client`` as the SDK's ``Client`` (it implements the part an agent calls)."""
    return client


class _Client:
    def __init__(self) -> None:
        self.first: float | None = None

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        if self.first is None and getattr(update, "session_update", "") == "agent_message_chunk":
            self.first = time.perf_counter()

    def on_connect(self, conn: Any) -> None:
        pass


async def _direct_once(cwd: str, home: str) -> tuple[float, float]:
    from acp import spawn_agent_process, text_block

    client = _Client()
    env = {"HOME": home, "PATH": "/usr/bin:/bin"}
    t0 = time.perf_counter()
    async with spawn_agent_process(_as_client(client), sys.executable, str(TINY), env=env) as (
        conn,
        _,
    ):
        await conn.initialize(protocol_version=1)
        made = await conn.new_session(cwd=cwd, mcp_servers=[])
        await conn.prompt(session_id=made.session_id, prompt=[text_block("hello")])
        done = time.perf_counter()
    assert client.first is not None
    return client.first - t0, done - t0


async def _warm(n: int, cwd: str, home: str) -> tuple[list[float], list[float]]:
    from acp import spawn_agent_process, text_block

    client = _Client()
    env = {"HOME": home, "PATH": "/usr/bin:/bin"}
    firsts: list[float] = []
    walls: list[float] = []
    async with spawn_agent_process(_as_client(client), sys.executable, str(TINY), env=env) as (
        conn,
        _,
    ):
        await conn.initialize(protocol_version=1)
        made = await conn.new_session(cwd=cwd, mcp_servers=[])
        for _ in range(n + 2):
            client.first = None
            t0 = time.perf_counter()
            await conn.prompt(session_id=made.session_id, prompt=[text_block("hello")])
            walls.append(time.perf_counter() - t0)
            assert client.first is not None
            firsts.append(client.first - t0)
    return firsts[2:], walls[2:]


def direct_warm(n: int) -> tuple[list[float], list[float]]:
    """``n`` prompts to one agent process kept between them: (first update, answer)."""
    with tempfile.TemporaryDirectory() as home:
        return asyncio.run(_warm(n, home, home))


def direct(n: int) -> tuple[list[float], list[float]]:
    """``n`` prompts each to an agent spawned for it (two more first, to warm up): (first
    update, answer)."""
    firsts, walls = [], []
    with tempfile.TemporaryDirectory() as home:
        for i in range(n + 2):
            first, wall = asyncio.run(_direct_once(home, home))
            if i >= 2:
                firsts.append(first)
                walls.append(wall)
    return firsts, walls


@contextlib.contextmanager
def agent_fleet(url: str, prefix: str) -> Iterator[Any]:
    """One host's turn workers reading an agents file that names the tiny agent."""
    from bench.common import configure
    from localfleet.fleet import LocalFleet

    state = Path(tempfile.mkdtemp(prefix="fleet-agents-bench-"))
    agents = state / "agents.toml"
    agents.write_text(_toml())
    env = {"FLEET_AGENTS_FILE": str(agents), "FLEET_STATE_DIR": str(state / "state")}
    fleet = LocalFleet(url, prefix, state, hostname="bench-agents", extra_env=env)
    fleet.start(["turn"])
    store, dispatcher = configure(url, prefix, agents_file=agents)
    try:
        fleet.wait_ready(90)
        yield fleet, store, dispatcher
    finally:
        fleet.stop()
        store.close()


def _wait(pubsub: Any, sid: str, tid: str, t0: float) -> tuple[float, float]:
    first = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=1.0)
        if msg is None:
            continue
        event = json.loads(msg["data"])
        if event.get("sessionId") != sid:
            continue
        kind = (event.get("update") or {}).get("sessionUpdate")
        if first is None and kind == "agent_message_chunk":
            first = time.perf_counter() - t0
        if event.get("type") == "turn" and event.get("turnId") == tid:
            assert event["state"] == "completed", event
            assert first is not None
            return first, time.perf_counter() - t0
    raise TimeoutError(f"turn {tid} did not end")


def through_fleet(store: Any, dispatcher: Any, n: int) -> tuple[list[float], list[float]]:
    """``n`` prompts of one session through the fleet (two more first): (first update, turn
    end)."""
    from orchestrator.session.sessions import create_session
    from orchestrator.turn import turns

    sid = create_session(store, tempfile.mkdtemp(), agent="tiny").session_id
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events)
    firsts, walls = [], []
    try:
        for i in range(n + 2):
            t0 = time.perf_counter()
            tid = turns.start_turn(store, dispatcher, sid, "hello")
            first, wall = _wait(pubsub, sid, tid, t0)
            if i >= 2:
                firsts.append(first)
                walls.append(wall)
    finally:
        pubsub.close()
    return firsts, walls


def first_prompts(store: Any, dispatcher: Any, n: int) -> list[float]:
    """The first prompt of ``n`` new sessions through the fleet: time to its first update."""
    from orchestrator.session.sessions import create_session
    from orchestrator.turn import turns

    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events)
    firsts = []
    try:
        for _ in range(n):
            sid = create_session(store, tempfile.mkdtemp(), agent="tiny").session_id
            t0 = time.perf_counter()
            tid = turns.start_turn(store, dispatcher, sid, "hello")
            firsts.append(_wait(pubsub, sid, tid, t0)[0])
    finally:
        pubsub.close()
    return firsts


def idle_rates(
    url: str, store: Any, dispatcher: Any, agents: int, seconds: float
) -> tuple[float, float, dict[str, int]]:
    """The fleet's Redis commands per second at rest, before and after ``agents`` sessions
    each ran one prompt (their agents then idle in the worker's pool), over ``seconds``
    each; and the commands of the second reading."""
    import redis

    from bench.step_cost import commandstats, delta
    from orchestrator.session.sessions import create_session
    from orchestrator.turn import turns

    raw = redis.Redis.from_url(url, decode_responses=True)

    def rate() -> tuple[float, dict[str, int]]:
        before = commandstats(raw)
        time.sleep(seconds)
        used = delta(before, commandstats(raw))
        return sum(used.values()) / seconds, used

    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events)
    try:
        none, _ = rate()
        for _ in range(agents):
            sid = create_session(store, tempfile.mkdtemp(), agent="tiny").session_id
            _wait(pubsub, sid, turns.start_turn(store, dispatcher, sid, "hello"), 0.0)
        time.sleep(1.0)  # the last turn's task events and bookkeeping settle
        held, used = rate()
    finally:
        pubsub.close()
        raw.close()
    return none, held, used


def archive_to_gone(store: Any, dispatcher: Any, n: int) -> list[float]:
    """``n`` archives of a session whose agent runs ``sleep``: seconds from the archive's
    answer until the command is gone."""
    from orchestrator.archiving.archive import archive
    from orchestrator.session.sessions import create_session
    from orchestrator.turn import turns
    from tests.agents.fleet_support import processes_with

    gone = []
    for _ in range(n):
        sid = create_session(store, tempfile.mkdtemp(), agent="tiny").session_id
        mark = f"300.{uuid.uuid4().int % 10**6}"
        turns.start_turn(store, dispatcher, sid, f"run: sleep {mark}")
        deadline = time.monotonic() + 60
        while not processes_with(f"sleep {mark}"):
            if time.monotonic() > deadline:
                raise TimeoutError("the agent's command did not start")
            time.sleep(0.01)
        archive(store, dispatcher, sid, stop_activity=True)
        t0 = time.perf_counter()
        while processes_with(f"sleep {mark}"):
            if time.perf_counter() - t0 > 30:
                raise TimeoutError("the agent's command outlived its archive by 30 s")
            time.sleep(0.001)
        gone.append(time.perf_counter() - t0)
    return gone


def bench_agents(url: str, prefix: str, n: int) -> list[Row]:
    """Benchmark 14 with ``n`` prompts per figure and ``n`` archives."""
    med = statistics.median
    w_first, w_wall = direct_warm(n)
    d_first, _ = direct(n)
    with agent_fleet(url, prefix) as (_fleet, store, dispatcher):
        f_first, f_wall = through_fleet(store, dispatcher, n)
        cold = first_prompts(store, dispatcher, n)
        gone = archive_to_gone(store, dispatcher, n)
        idle_agents = 5 if n < 20 else 50
        none, held, used = idle_rates(url, store, dispatcher, idle_agents, 10.0)
    over_first = med(f_first) - med(w_first)
    return [
        (
            "14 agent prompt, agent process kept: time to first update, fleet vs direct ACP "
            "(tiny agent)",
            f"n={n}",
            f"fleet {ms(med(f_first))} / direct {ms(med(w_first))} "
            f"(median overhead {over_first * 1000:.1f} ms)",
            "goal overhead <= 20 ms: " + ("met" if over_first <= 0.020 else "MISSED"),
        ),
        (
            "14 agent prompt, agent process kept: whole turn, fleet vs direct ACP",
            f"n={n}",
            f"fleet {ms(med(f_wall))} / direct {ms(med(w_wall))} "
            f"(median overhead {(med(f_wall) - med(w_wall)) * 1000:.1f} ms)",
            "lower is better",
        ),
        (
            "14 a session's first prompt (agent started for it): time to first update",
            f"n={n}",
            f"fleet {ms(med(cold))} / direct spawn {ms(med(d_first))} "
            f"(median overhead {(med(cold) - med(d_first)) * 1000:.1f} ms)",
            "the agent's own start dominates",
        ),
        (
            f"14 one host's idle turn worker holding {idle_agents} idle agent processes",
            "10 s each",
            f"{held:.2f} commands/s ({', '.join(f'{k} {v}' for k, v in sorted(used.items()))})",
            f"with none: {none:.2f} commands/s; goal: nothing beyond the heartbeat",
        ),
        (
            "14 archive answer -> agent's command gone",
            f"n={n}",
            f"median {ms(med(gone))}, p99 {ms(pct(gone, 99))}",
            "goal p99 <= 1 s: " + ("met" if pct(gone, 99) <= 1.0 else "MISSED"),
        ),
    ]


if __name__ == "__main__":
    from bench.common import environment

    with environment(None) as (redis_url, key_prefix):
        for row in bench_agents(redis_url, key_prefix, int(sys.argv[1]) if sys.argv[1:] else 20):
            print(" | ".join(row))
