"""An open-loop (paced) HTTP client: requests leave on a schedule, not when the last is answered.

A closed loop of ``c`` clients keeps ``c`` requests in flight, so its mean latency is ``c``
divided by its rate (Little's law) whatever the server does; a latency goal under load needs
arrivals that do not wait for answers. Here:

* ``schedule``: Poisson arrivals at an offered rate over a fixed duration, from a fixed seed
  (the same schedule every run);
* ``run_paced``: each request is sent at its scheduled time over a pool of keep-alive HTTP/1.1
  connections (``KeepAlive``, ``h11``); when every connection is busy it waits for one, and its
  latency runs from its *scheduled* time to its answer, so that wait is counted (no
  coordinated omission: a slow server cannot slow the arrivals that measure it);
* ``climb``: offered rates in turn until the achieved rate falls below 90% of the offered one
  (saturation), and ``paced_rows`` / ``sustainable`` to report them.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from bench.common import Row, ms, pct

#: Below this share of the offered rate achieved, the server is saturated: climbing stops.
SATURATED = 0.9
#: The latency goal the sustainable rate is read at (seconds).
P99_GOAL = 0.02


class KeepAlive:
    """One keep-alive HTTP/1.1 connection (``h11`` over asyncio streams), one request at a
    time."""

    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._host, self._reader, self._writer = host, reader, writer
        self._conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, host: str, port: int) -> KeepAlive:
        """Connect to ``host:port``; raises ``OSError`` when nothing answers."""
        reader, writer = await asyncio.open_connection(host, port)
        return cls(host, reader, writer)

    async def post(self, target: str, body: bytes) -> tuple[int, bytes]:
        """POST the JSON ``body`` to ``target`` (a path); (status, response body). Raises
        ``ConnectionError`` when the server closes the connection."""
        conn = self._conn
        headers = [
            ("Host", self._host),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ]
        request = h11.Request(method="POST", target=target, headers=headers)
        self._writer.write(conn.send(request) + conn.send(h11.Data(data=body)))
        self._writer.write(conn.send(h11.EndOfMessage()))
        answer = await self._answer()
        conn.start_next_cycle()
        return answer

    async def _answer(self) -> tuple[int, bytes]:
        status, chunks = 0, []
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                self._conn.receive_data(await self._reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the server closed the connection")

    def close(self) -> None:
        self._writer.close()


def schedule(rate: float, duration: float, seed: int = 8) -> list[float]:
    """Arrival times (seconds from the start, ascending, in ``[0, duration)``) of a Poisson
    process at ``rate`` a second, given its count: ``round(rate * duration)`` arrivals placed
    uniformly at random and sorted, so the gaps are exponential with mean about ``1 / rate``
    and the offered rate is exactly ``rate``. The same ``seed`` gives the same schedule."""
    rng = random.Random(seed)
    return sorted(rng.uniform(0.0, duration) for _ in range(round(rate * duration)))


@dataclass
class Paced:
    """One paced run: ``offered`` and ``achieved`` in requests a second (achieved: answers
    over the run, which lasts at least its schedule's duration and until the last answer);
    ``latencies`` in seconds from each request's scheduled time to its answer, in schedule
    order; ``cpu`` the server's CPU seconds per request and ``busy`` the machine's busy
    percent over the run, when measured."""

    offered: float
    achieved: float
    latencies: list[float]
    cpu: float = 0.0
    busy: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p99(self) -> float:
        return pct(self.latencies, 0.99)

    @property
    def saturated(self) -> bool:
        return self.achieved < SATURATED * self.offered


async def paced(
    host: str,
    port: int,
    targets: list[str],
    arrivals: list[float],
    body: bytes,
    connections: int,
) -> tuple[float, list[float], list[str]]:
    """POST ``body`` to ``targets[i]`` at ``arrivals[i]`` seconds from now (plus a short lead),
    over ``connections`` keep-alive connections; (seconds from the start to the last answer,
    latencies from the scheduled times, the bodies of answers other than 200)."""
    pool: asyncio.Queue[KeepAlive] = asyncio.Queue()
    opened = [await KeepAlive.open(host, port) for _ in range(connections)]
    for conn in opened:
        pool.put_nowait(conn)
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05  # every arrival is in the future when its task starts
    latencies = [0.0] * len(arrivals)
    failures: list[str] = []

    async def one(i: int) -> None:
        due = start + arrivals[i]
        await asyncio.sleep(due - loop.time())
        conn = await pool.get()  # all busy: the request waits, and the wait counts
        try:
            status, answer = await conn.post(targets[i], body)
        finally:
            pool.put_nowait(conn)
        latencies[i] = loop.time() - due
        if status != 200:
            failures.append(answer[:200].decode(errors="replace"))

    try:
        await asyncio.gather(*(one(i) for i in range(len(arrivals))))
    finally:
        for conn in opened:
            conn.close()
    return loop.time() - start, latencies, failures


def run_paced(
    base: str,
    targets: list[str],
    arrivals: list[float],
    duration: float,
    body: bytes,
    connections: int = 32,
) -> Paced:
    """``paced`` against the server at ``base`` (``http://host:port``), in its own event loop;
    ``duration`` is the schedule's (seconds). Raises ``RuntimeError`` when any answer was not
    200, ``ConnectionError``/``OSError`` when the server could not be reached or hung up."""
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    span, latencies, failures = asyncio.run(paced(host, port, targets, arrivals, body, connections))
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(targets)} failed, first: {failures[0]}")
    n = len(arrivals)
    return Paced(offered=n / duration, achieved=n / max(duration, span), latencies=latencies)


def climb(rates: Iterable[float], measure: Callable[[float], Paced]) -> list[Paced]:
    """``measure`` each offered rate (ascending) until one saturates (achieved below 90% of
    offered; that run is kept, the higher rates are not tried)."""
    runs: list[Paced] = []
    for rate in rates:
        runs.append(measure(rate))
        if runs[-1].saturated:
            break
    return runs


def sustainable(runs: list[Paced]) -> Paced | None:
    """The highest offered rate of ``runs`` not saturated with p99 <= 20 ms, or None."""
    good = [r for r in runs if not r.saturated and r.p99 <= P99_GOAL]
    return max(good, key=lambda r: r.offered, default=None)


def paced_rows(label: str, runs: list[Paced], duration: float, note: str = "") -> list[Row]:
    """One row per run of ``runs`` and a last one with the sustainable rate at p99 <= 20 ms;
    ``label`` names the thing measured, ``note`` ends the last row."""
    rows: list[Row] = []
    for r in runs:
        per_core = f" ({1 / r.cpu:.0f}/s per core)" if r.cpu else ""
        rows.append(
            (
                f"8 paced, {label}, {r.offered:.0f}/s offered",
                f"n={len(r.latencies)} in {duration:g} s",
                f"achieved {r.achieved:.0f}/s, median {ms(r.median)}, p99 {ms(r.p99)}",
                f"machine {r.busy:.0f}% busy; API CPU {ms(r.cpu)} per request{per_core}"
                + ("; saturated (achieved < 90% of offered)" if r.saturated else ""),
            )
        )
    best = sustainable(runs)
    found = f"{best.offered:.0f}/s" if best else "none of the rates tried"
    rows.append((f"8 paced, {label}: sustainable rate at p99 <= 20 ms", "", found, note))
    return rows
