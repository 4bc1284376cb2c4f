"""CPU of one publish of an archive's four stops: messages rendered from templates against
messages built by Celery, paired in one process.

    python -m bench.stop_batch_cpu [--batches 2000] [--repeats 7] [--redis-url URL]

Two ``CeleryDispatcher``s on one app send the same batch (``turn.stop``, ``job.stop``,
``subagent.stop``, ``reminder.stop``, each to its control queue, with an archive's arguments):

- ``templates``: the fleet's dispatcher (after the first batch, every message is rendered
  from its pair's template, ``workers.messages``);
- ``celery``: the same dispatcher with templates off, every message built and published by
  Celery (``create_task_message`` and ``send_task_message``).

Each repeat times ``--batches`` batches of one path, then of the other (the order alternates
from repeat to repeat) with ``time.process_time``; the queues are emptied between blocks,
outside the timing. Printed: per path, the median over repeats of the CPU per batch, and the
load average (the figures are CPU time, but quote the load with them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import redis

from bench.common import environment


def dispatchers(url: str, prefix: str) -> dict[str, Any]:
    """The two paths, on one app."""
    from orchestrator.settings import FleetSettings
    from workers.app import create_app
    from workers.dispatch import CeleryDispatcher

    class CeleryBuilt(CeleryDispatcher):
        def _template_session(self, producer: Any, batch: Any) -> None:
            return None

    app = create_app(FleetSettings(redis_url=url, key_prefix=prefix))
    return {"templates": CeleryDispatcher(app), "celery": CeleryBuilt(app)}


def batch() -> list[tuple[str, list[Any], str]]:
    """An archive's four stops of a session busy in every family."""
    sid = "0b6c2a52-4f7e-4c39-9d36-6f4a0a6e1f10"
    return [
        ("turn.stop", [sid, ["turn-1a2b3c4d"]], "turn.ctl"),
        ("job.stop", [sid, ["job-5e6f7a8b"]], "job.ctl.bench-host"),
        ("subagent.stop", [sid, {"child-9c0d": {"turns": ["turn-1e2f"]}}], "subagent.ctl"),
        ("reminder.stop", [sid, ["rem-3a4b5c6d"]], "reminder.ctl"),
    ]


def run(url: str, prefix: str, batches: int, repeats: int) -> dict[str, list[float]]:
    """CPU seconds per batch, per path, one figure per repeat."""
    paths = dispatchers(url, prefix)
    messages = batch()
    raw = redis.Redis.from_url(url)
    for dispatcher in paths.values():  # connections, queue declarations, templates
        for _ in range(20):
            assert dispatcher.send_many(messages) == [None] * 4
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            send = paths[name].send_many
            start = time.process_time()
            for _ in range(batches):
                send(messages)
            cpu[name].append((time.process_time() - start) / batches)
            for key in raw.scan_iter(match=f"{prefix}celery:*ctl*"):
                raw.delete(key)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--redis-url", default=None)
    opts = parser.parse_args()
    before = os.getloadavg()[0]
    with environment(opts.redis_url) as (url, prefix):
        cpu = run(url, prefix, opts.batches, opts.repeats)
    print(f"load average (1 min): {before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for name, figures in cpu.items():
        runs = " ".join(f"{x * 1000:.3f}" for x in figures)
        print(
            f"{name:<10} CPU per 4-stop batch: median {statistics.median(figures) * 1000:.3f} ms"
            f"  (repeats: {runs})"
        )


if __name__ == "__main__":
    main()
