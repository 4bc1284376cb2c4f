"""Benchmark 11: what the fleet adds to a shell tool call.

The same command (``true``) run three ways, alternating, in this process against the same
Redis: as a bare child process under coreutils ``timeout`` (the floor: what the tool itself
must do); as the ``shell`` tool runs it in a turn worker (``tools._shell``: the output drain,
the cancel loop, and the exec warden watching it, ``orchestrator/process/execwatch.py``, one per
process); and with a warden started for that one call, which is what every call cost before
the warden was shared (an interpreter importing the store's modules, per call). Printed per
way: the median wall time and the CPU seconds per call, the warden's own included.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.common import Row, configure, cpu_seconds, ms


def _cpu(warden_pid: int | None) -> float:
    """CPU seconds of this process, its reaped children and the warden so far."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return own + (cpu_seconds(warden_pid) if warden_pid else 0.0)


def bench_shell(url: str, prefix: str, n: int) -> list[Row]:
    """``n`` calls each way (after 3 warm-up calls of each)."""
    from orchestrator.process import execwatch
    from orchestrator.process.processes import under_timeout
    from orchestrator.session.fencing import StepGuard
    from orchestrator.turn import tools
    from orchestrator.turn.toolbox import ShellArgs

    store, _ = configure(url, prefix)
    guard = StepGuard("bench-turn", "bench-token")
    store.redis.set(store.keys.step_lease(guard.turn_id), guard.token, px=3_600_000)
    args, cwd, cancel = ShellArgs(command="true"), os.getcwd(), threading.Event()
    warden = execwatch.warden(store)
    env = {**os.environ, "FLEET_REDIS_URL": store.url, "FLEET_KEY_PREFIX": store.keys.prefix}

    def floor() -> None:
        argv, preexec = under_timeout(["/bin/sh", "-c", "true"])
        subprocess.run(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            preexec_fn=preexec,
            check=True,
        )

    def tool() -> None:
        status, _ = tools._shell(store, guard, args, cwd, cancel)
        assert status == "completed", status

    def per_call() -> None:
        # The alternative measured: a watchdog interpreter started beside each command and
        # killed once the command ended (a short command ends it mid-start-up).
        proc = subprocess.Popen(  # its beats (a byte on stdout each) are not for the table
            [sys.executable, "-P", "-m", "orchestrator.process.execwatch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        floor()
        proc.kill()
        proc.communicate(timeout=60)

    def start_up() -> float:
        # What a command running a second or more paid: the watchdog's whole start-up (here
        # it ends at once, its stdin closed).
        c0 = _cpu(None)
        subprocess.run(
            [sys.executable, "-P", "-m", "orchestrator.process.execwatch"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            check=True,
        )
        return _cpu(None) - c0

    ways: dict[str, Any] = {"floor": floor, "tool": tool, "per_call": per_call}
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(3):
        for fn in ways.values():
            fn()
    for _ in range(n):
        for name, fn in ways.items():
            c0, t0 = _cpu(warden.pid), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(_cpu(warden.pid) - c0)
    whole = [start_up() for _ in range(5)]
    warden.close()
    store.redis.delete(store.keys.step_lease(guard.turn_id))

    def said(name: str) -> str:
        return (
            f"median {ms(statistics.median(wall[name]))},"
            f" CPU {statistics.mean(cpu[name]) * 1000:.1f} ms per call"
        )

    tool_cpu, floor_cpu = statistics.mean(cpu["tool"]), statistics.mean(cpu["floor"])
    return [
        (
            "11 shell tool call (`true`), as a turn worker runs it: output drain, cancel loop,"
            " the process's shared exec warden watching it",
            f"n={n} each, alternating",
            said("tool"),
            f"floor (the bare command under timeout): {said('floor')};"
            f" {statistics.median(wall['tool']) / statistics.median(wall['floor']):.2f}x the"
            f" floor's wall, {round((tool_cpu - floor_cpu) * 1000, 1) + 0.0:+.1f} ms CPU",
        ),
        (
            "11 the same command with a watchdog process started for the call and killed"
            " when it ends (each call's cost before the warden was shared)",
            f"n={n}; start-up n=5",
            said("per_call") + f"; a whole start-up (a command of a second or more):"
            f" CPU {statistics.median(whole) * 1000:.0f} ms",
            f"{statistics.mean(cpu['per_call']) / tool_cpu:.1f}x the shared warden's CPU per"
            f" call, {statistics.median(whole) / tool_cpu:.0f}x for the longer command",
        ),
    ]
