"""Benchmark 1 without HTTP: an archive with ``stopActivity`` in process, phase by phase, with
the stop publish of ``CeleryDispatcher.send_many`` beside the ways it published before.

    python -m bench.archive_phases [--n 600] [--redis-url URL]

Sessions are seeded busy in all four families (``seed_busy``), then each is archived as the
HTTP API archives it (``archive.archive(..., stop_activity=True, defer=executor.submit)``: the
fan-out's counts and audit entry go to a single-thread executor), in turn through three
dispatchers, so all see the same load:

- ``send_many``: the fleet's ``CeleryDispatcher`` (messages rendered from templates learned
  from the first message Celery built for each task and queue, ``workers.messages``, in one
  producer batch, through the fleet's broker transport);
- ``celery-built``: the same with templates off: every message built with
  ``app.amqp.create_task_message`` and published with ``app.amqp.send_task_message``;
- ``send_task``: the same dispatcher publishing each message with ``app.send_task`` in one
  producer batch, through kombu's own Redis transport (a Redis client built per batch): how
  the stops were published before.

Printed per path, as median and p99 (wall clock, ``time.perf_counter``) and the calling
thread's CPU median (``time.thread_time``): the whole archive, its archive script round trip
and its stop publish (4 messages and their 4 ``task-sent`` events in one pipelined write);
then the floors: one fsynced write (``SET``) and a pipeline of 4 ``LPUSH`` + 4 ``PUBLISH``.

The machine's other work shows in wall clock first: quote the load (printed) with the figures
and run it 2-3 times.
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
        for name in sorted(self.wall):
            wall, cpu = self.wall[name], self.cpu[name]
            out.append(
                f"{name:<36} n={len(wall):<5} median {ms(statistics.median(wall))}"
                f"  p99 {ms(pct(wall, 0.99))}  cpu median {ms(statistics.median(cpu))}"
            )
        return out


def send_task_dispatcher(url: str, prefix: str) -> Any:
    """A ``CeleryDispatcher`` publishing a batch with ``send_task`` per message through
    kombu's own Redis transport."""
    from orchestrator.settings import FleetSettings
    from workers.app import create_app
    from workers.dispatch import CeleryDispatcher

    class SendTaskDispatcher(CeleryDispatcher):
        def _publish_batch(self, messages: list[Any]) -> None:
            with self.app.producer_or_acquire() as producer, producer.batch():
                for task, args, queue in messages:
                    self._send_task(producer, task, args, queue)

    app = create_app(FleetSettings(redis_url=url, key_prefix=prefix))
    app.conf.broker_transport = "redis"
    return SendTaskDispatcher(app)


def celery_built_dispatcher(url: str, prefix: str) -> Any:
    """A ``CeleryDispatcher`` with templates off: Celery builds every message."""
    from orchestrator.settings import FleetSettings
    from workers.app import create_app
    from workers.dispatch import CeleryDispatcher

    class CeleryBuilt(CeleryDispatcher):
        def _template_session(self, producer: Any, batch: Any) -> None:
            return None

    return CeleryBuilt(create_app(FleetSettings(redis_url=url, key_prefix=prefix)))


def run(url: str, prefix: str, n: int) -> list[str]:
    from orchestrator.archiving import archive

    store, fleet = configure(url, prefix)
    dispatchers = {
        "send_many": fleet,
        "celery-built": celery_built_dispatcher(url, prefix),
        "send_task": send_task_dispatcher(url, prefix),
    }
    names = list(dispatchers)
    phases = Phases()
    ids = seed_busy(store, len(names) * (n + 10))
    executor = concurrent.futures.ThreadPoolExecutor(1)
    for dispatcher in dispatchers.values():
        for sid in [ids.pop() for _ in range(10)]:  # warm-up: connections, scripts, queues
            archive.archive(store, dispatcher, sid, stop_activity=True, defer=executor.submit)
    real_run = store.run
    current = ["send_many"]

    def run_script(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "archive":
            timed = phases.time(f"{current[0]}: archive script", real_run)
            return timed(name, *args, **kwargs)
        return real_run(name, *args, **kwargs)

    store.run = run_script  # type: ignore[method-assign]
    archives = {}
    for name, dispatcher in dispatchers.items():
        dispatcher.send_many = phases.time(f"{name}: publish 4 stops", dispatcher.send_many)
        archives[name] = phases.time(f"{name}: whole archive", archive.archive)
    for i, sid in enumerate(ids):
        name = current[0] = names[i % len(names)]
        archives[name](store, dispatchers[name], sid, stop_activity=True, defer=executor.submit)
        executor.submit(lambda: None).result()  # the deferred write is not in the next one
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--n", type=int, default=600, help="archives per dispatcher")
    parser.add_argument("--redis-url", default=None)
    opts = parser.parse_args()
    before = os.getloadavg()[0]
    with environment(opts.redis_url) as (url, prefix):
        lines = run(url, prefix, opts.n)
    print(f"load average (1 min): {before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
