"""Redis memory per idle session, measured so that a server hash table doubling inside the
measured span is not counted as the sessions' own growth.

A Redis dict's bucket array is 8 bytes a slot and doubles when its entries reach its slot
count (2^k), all at once: adding sessions to a store near 2^20 entries in a fleet-wide index
grows ``used_memory`` by 16 MiB in one step, whatever the sessions hold. A growth over one
span divided by its sessions reads that doubling as bytes per session when the span holds one
and not when it doesn't. So the idle sessions are added in steps, and

    per session = median over quiet steps of (used_memory growth / sessions added)
                  + sum over the tables T a session enters of 8 B * slots(T) / entries(T)
                    * (entries a session adds to T)

A quiet step is one in which no table's slot count changed (read from the counts, below), no
fork child (AOF rewrite, RDB save) ran, and whose growth per session is within ``TOLERANCE`` of
the median of the steps not known to be disturbed (else a resize the counts do not show, such
as an incremental rehash finishing and freeing the old table, was in it). A quiet step's growth
holds no bucket arrays, so each session's share of them is added back at the tables' size after
the fleet was seeded (the start of the span; a table the span creates, at its end).

Slots, on Redis 7.0 (``DEBUG HTSTATS`` is off unless ``enable-debug-command`` is set at
start-up): the keyspace's from ``MEMORY STATS`` (``overhead.hashtable.main`` = keys * (24 B
dictEntry + 16 B robj) + slots * 8 B; during a rehash both tables' slots); a sorted set's
(skiplist encoding; a listpack one has no dict) from its cardinality: a dict that only grew has
the smallest power of two >= its entries, at least 4. A fork child stops dicts from growing
until it exits (a million run with an AOF rewrite in its span read 978, one without 1,143), so
each step first waits for none to be running.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: How far (as a fraction) a step's growth per session may be from the median of the steps
#: not known to be disturbed before it is taken for a resize the counts did not show.
TOLERANCE = 0.05
#: Bytes of one dict bucket (a pointer).
BUCKET = 8
#: Seconds to wait for a running AOF rewrite or RDB save to end before a step.
FORK_WAIT = 300.0


@dataclass(frozen=True)
class Step:
    """One step of the span: ``sessions`` added, ``growth`` bytes of ``used_memory``,
    ``resized`` the tables whose slot count changed in it, ``forked`` whether a fork child ran
    during it."""

    sessions: int
    growth: int
    resized: tuple[str, ...] = ()
    forked: bool = False


@dataclass(frozen=True)
class Table:
    """A dict the sessions enter: ``slots`` and ``entries`` when read, ``added`` entries per
    session added."""

    name: str
    slots: int
    entries: int
    added: float

    @property
    def share(self) -> float:
        """Bytes of this table's buckets per session added."""
        return BUCKET * self.slots / self.entries * self.added if self.entries else 0.0


@dataclass(frozen=True)
class Figure:
    """Bytes per idle session: ``per_session`` = ``steady`` (median growth of the quiet steps)
    + ``buckets`` (the sessions' share of the tables' buckets); ``span``: growth over all
    steps / sessions; ``left_out``: 0-based indexes of the steps that were not quiet."""

    per_session: float
    steady: float
    buckets: float
    span: float
    left_out: tuple[int, ...]


def per_session(steps: list[Step], tables: list[Table], tolerance: float = TOLERANCE) -> Figure:
    """The figure of the module docstring from ``steps`` and ``tables``. Raises ``ValueError``
    when no step is quiet."""
    rates = [s.growth / s.sessions for s in steps]
    known = [r for s, r in zip(steps, rates, strict=True) if not s.resized and not s.forked]
    if not known:
        raise ValueError("every step resized a table or ran beside a fork child")
    reference = statistics.median(known)
    left_out = tuple(
        i
        for i, (s, r) in enumerate(zip(steps, rates, strict=True))
        if s.resized or s.forked or abs(r - reference) > tolerance * reference
    )
    quiet = [r for i, r in enumerate(rates) if i not in left_out]
    if not quiet:
        raise ValueError("no step's growth is near the median of the undisturbed ones")
    steady = statistics.median(quiet)
    buckets = sum(t.share for t in tables)
    span = sum(s.growth for s in steps) / sum(s.sessions for s in steps)
    return Figure(steady + buckets, steady, buckets, span, left_out)


def dict_slots(entries: int) -> int:
    """Slots of a Redis 7.0 dict that only grew to ``entries`` (0 when empty)."""
    return 0 if entries == 0 else max(4, 1 << (entries - 1).bit_length())


class Probe:
    """Reads ``used_memory``, fork children and the slots of the keyspace and of the sorted
    sets named ``zsets`` (full key names) on ``client`` (a ``redis.Redis`` decoding
    responses); ``strip`` is cut from key names in the tables' names."""

    def __init__(self, client: Any, zsets: list[str], strip: str = "") -> None:
        self.client, self.zsets, self.strip = client, zsets, strip

    def tables(self) -> dict[str, tuple[int, int]]:
        """``{name: (slots, entries)}`` for the keyspace and each sorted set with a dict."""
        db = self.client.connection_pool.connection_kwargs.get("db", 0)
        main = int(self.client.memory_stats().get(f"db.{db}", {}).get("overhead.hashtable.main", 0))
        keys = int(self.client.dbsize())
        out = {"keyspace": ((main - keys * 40) // BUCKET, keys)}
        for key in self.zsets:
            if self.client.object("encoding", key) == "skiplist":
                n = int(self.client.zcard(key))
                out[key.removeprefix(self.strip)] = (dict_slots(n), n)
        return out

    def used(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def forks(self) -> tuple[int, bool]:
        """(fork children started so far, whether one is running now)."""
        persistence = self.client.info("persistence")
        running = bool(
            int(persistence.get("aof_rewrite_in_progress", 0))
            or int(persistence.get("rdb_bgsave_in_progress", 0))
        )
        return int(self.client.info("stats").get("total_forks", 0)), running

    def wait_no_fork(self, timeout: float = FORK_WAIT) -> bool:
        """Wait (polling) until no fork child runs; ``False`` if one still does at ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.forks()[1]:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


def measure(
    probe: Probe, add: Callable[[int], None], sessions: int, steps: int = 10
) -> tuple[Figure, list[Step], list[Table]]:
    """Add ``sessions`` idle sessions through ``add(n)`` in ``steps`` steps and return the
    figure, the steps and the tables it was computed from (module docstring)."""
    start = probe.tables()
    done: list[Step] = []
    for i in range(steps):
        n = sessions // steps + (sessions % steps if i == steps - 1 else 0)
        probe.wait_no_fork()
        forks0, _ = probe.forks()
        before, used = probe.tables(), probe.used()
        add(n)
        growth = probe.used() - used
        after = probe.tables()
        forks1, running = probe.forks()
        resized = tuple(n for n in after if before.get(n, (0, 0))[0] != after[n][0])
        done.append(Step(n, growth, resized, forked=running or forks1 != forks0))
    end = probe.tables()
    tables = []
    for name, (slots, entries) in end.items():
        added = (entries - start.get(name, (0, 0))[1]) / sessions
        at_start = start.get(name)
        slots, entries = at_start if at_start and at_start[1] else (slots, entries)
        tables.append(Table(name, slots, entries, added))
    return per_session(done, tables), done, tables
