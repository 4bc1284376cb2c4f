"""Benchmark 1 without HTTP: an archive with ``stopActivity`` in process, phase by phase.

    python -m bench.archive_phases [--n 600] [--redis-url URL]

Sessions are seeded busy in all four families (``seed_busy``), then each is archived as the
HTTP API archives it (``archive.archive(..., stop_activity=True, defer=executor.submit)``: the
fan-out's counts and audit entry go to a single-thread executor). Printed, as median and p99
(wall clock, ``time.perf_counter``) and the calling thread's CPU median
(``time.thread_time``):

- the whole archive;
- its archive script round trip (``Store.run("archive")``);
- its stop publish (``CeleryDispatcher.send_many``: 4 messages and their 4 ``task-sent``
  events in one pipelined write);
- the same 4 messages published with ``send_task`` inside one producer batch (how
  ``send_many`` published them before it built the messages itself), interleaved with the
  archives so both see the same load;
- the floors: one fsynced write (``SET``), and a pipeline of 4 ``LPUSH`` + 4 ``PUBLISH``.

Run it on a quiet machine, 2-3 times, and quote the load (``uptime``) with the figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis

from bench.common import configure, environment, ms, pct, seed_busy

STOPS = [
    ("turn.stop", ["s-1", ["t-1"]], "turn.ctl"),
    ("job.stop", ["s-1", ["j-1"]], "job.ctl.bench-host"),
    ("subagent.stop", ["s-1", {"c-1": {"turns": ["t-2"]}}], "subagent.ctl"),
    ("reminder.stop", ["s-1", ["r-1"]], "reminder.ctl"),
]


class Phases:
    """Wall and CPU seconds per named phase."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def time(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped to record each call under ``name``."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall.setdefault(name, []).append(time.perf_counter() - t0)
                self.cpu.setdefault(name, []).append(time.thread_time() - c0)

        return timed

    def lines(self) -> list[str]:
        out = []
        for name, wall in self.wall.items():
            cpu = self.cpu[name]
            out.append(
                f"{name:<34} n={len(wall):<5} median {ms(statistics.median(wall))}"
                f"  p99 {ms(pct(wall, 0.99))}  cpu median {ms(statistics.median(cpu))}"
            )
        return out


def send_task_batch(app: Any) -> None:
    """The 4 stop messages through ``send_task`` in one producer batch."""
    with app.producer_or_acquire() as producer, producer.batch():
        for task, args, queue in STOPS:
            app.send_task(
                task, args=args, queue=queue, routing_key=queue, retry=False, producer=producer
            )


def run(url: str, prefix: str, n: int) -> list[str]:
    from orchestrator import archive

    store, dispatcher = configure(url, prefix)
    phases = Phases()
    ids = seed_busy(store, n + 20)
    executor = concurrent.futures.ThreadPoolExecutor(1)
    for sid in ids[:20]:  # warm-up: connections, scripts, declarations
        archive.archive(store, dispatcher, sid, stop_activity=True, defer=executor.submit)
        send_task_batch(dispatcher.app)
    real_run = store.run

    def run_script(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "archive":
            return phases.time("archive script", real_run)(name, *args, **kwargs)
        return real_run(name, *args, **kwargs)

    store.run = run_script
    dispatcher.send_many = phases.time("send_many (4 stops + 4 events)", dispatcher.send_many)
    whole = phases.time("archive, stopActivity, in process", archive.archive)
    reference = phases.time("send_task x4 in one batch", send_task_batch)
    for sid in ids[20:]:
        whole(store, dispatcher, sid, stop_activity=True, defer=executor.submit)
        executor.submit(lambda: None).result()  # the deferred write is not in the next one
        reference(dispatcher.app)
    executor.shutdown()
    raw = redis.Redis.from_url(url)
    key = f"{prefix}bench:floor"
    write = phases.time("floor: one fsynced SET", lambda: raw.set(key, "1"))

    def pipeline() -> None:
        pipe = raw.pipeline(transaction=False)
        for i in range(4):
            pipe.lpush(f"{key}:q{i}", "x")
            pipe.publish(f"{key}:e", "x")
        pipe.execute()

    piped = phases.time("floor: 4 LPUSH + 4 PUBLISH piped", pipeline)
    for _ in range(n):
        write()
        piped()
    return phases.lines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--redis-url", default=None)
    opts = parser.parse_args()
    load = os.getloadavg()[0]
    with environment(opts.redis_url) as (url, prefix):
        lines = run(url, prefix, opts.n)
    print(f"load average (1 min) at start: {load:.2f}")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
