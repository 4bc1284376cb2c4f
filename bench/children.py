"""Benchmark 12: creating a subagent under a parent of 10, 1,000 and 12,000 children.

What Redis spends on one create (``create_session.lua``, ``INFO commandstats``: the script's
own time, during which every other command of the fleet waits) and what the caller waits
(``sessions.create_session``, wall clock, an fsynced write), beside a walk without the
busy-children index (every child's ``deleted`` and items read on each create), run as a
script of its own over the same children. The parents' children are idle, as a
fleet's finished subagents are; one more row puts 1,000 busy children (a reminder each, far
over the cap) under the widest parent: a refused create.
"""

from __future__ import annotations

import statistics
from typing import Any

import redis

from bench.common import Row, configure, fsync_relaxed, ms, pct, timed

#: The count without the busy-children index: every child read, on every create.
_WALK = """
local live = 0
for _, c in ipairs(redis.call('SMEMBERS', K.children(ARGV[2]))) do
  if redis.call('HGET', skey(c), 'deleted') == '0' and has_live(c) then live = live + 1 end
end
return live
"""


def _measured(raw: redis.Redis, run: Any, n: int) -> tuple[list[float], float]:
    """``n`` calls of ``run`` (one ``EVALSHA`` each): their wall-clock seconds, and the mean
    microseconds of server time per ``EVALSHA`` (``INFO commandstats``)."""
    raw.config_resetstat()
    wall = timed(run, n)
    stats: dict[str, Any] = raw.info("commandstats")
    return wall, float(stats["cmdstat_evalsha"]["usec_per_call"])


def bench_children(
    url: str, prefix: str, n: int, widths: tuple[int, ...] = (10, 1_000, 12_000)
) -> list[Row]:
    from orchestrator.errors import LimitReached
    from orchestrator.families import registry
    from orchestrator.reminder import reminders
    from orchestrator.session import sessions
    from orchestrator.storage import lualink
    from orchestrator.storage.store import _prelude

    store, _ = configure(url, prefix)
    raw = redis.Redis.from_url(url)
    walk = raw.register_script(lualink.link(_prelude(registry.version()), _WALK))
    cwd = "/bench/children"
    rows: list[Row] = []
    parent = ""
    for width in widths:
        with fsync_relaxed(url):
            parent = sessions.create_session(store, cwd).session_id
            for _ in range(width):
                sessions.create_session(store, cwd, parent)
        # A create adds a child: n of them move a parent of 10 to 10 + n, of 12,000 by 1%.
        # The walk first, over exactly `width` children; each create adds one (n of them move
        # a parent of 10 to 10 + n: a create does not read them).
        _, old = _measured(raw, lambda p=parent: walk(args=[prefix, p]), n)
        wall, server = _measured(raw, lambda p=parent: sessions.create_session(store, cwd, p), n)
        rows.append(
            (
                f"12 create a subagent, parent of {width:,} idle children",
                f"n={n}",
                f"Redis {server / 1000:.3f} ms/create; caller median {ms(statistics.median(wall))}"
                f", p99 {ms(pct(wall, 0.99))}",
                f"the old walk alone: {old / 1000:.3f} ms/create in Redis",
            )
        )
    with fsync_relaxed(url):
        busy = [sessions.create_session(store, cwd, parent).session_id for _ in range(1_000)]
        for c in busy:
            reminders.create_reminder(store, c, 3600, "later")

    def refused(p: str = parent) -> None:
        try:
            sessions.create_session(store, cwd, p)
        except LimitReached:
            return
        raise AssertionError("a create over the cap was not refused")

    _, old = _measured(raw, lambda p=parent: walk(args=[prefix, p]), n)
    wall, server = _measured(raw, refused, n)
    rows.append(
        (
            f"12 refused create (cap 32), parent of {len(busy):,} busy children "
            f"among {widths[-1] + n + len(busy):,}",
            f"n={n}",
            f"Redis {server / 1000:.3f} ms/create; caller median {ms(statistics.median(wall))}",
            f"the old walk alone: {old / 1000:.3f} ms/create in Redis",
        )
    )
    raw.close()
    store.close()
    return rows
