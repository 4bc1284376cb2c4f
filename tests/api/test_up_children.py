"""`fleet up`'s children: they never import a file of the working directory in place of a
module of the project, and a dead API or embedded Redis is restarted like a dead worker."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import ctrl_c_reaches_it, wait_for

#: Files named like modules the fleet imports; importing one kills the process that does.
SHADOWS = ("acp.py", "orchestrator.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _fleet_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    """``fleet up`` (its console script, as a user runs it) in ``tmp_path`` with the API, on
    its own embedded Redis (state in ``tmp_path/state``)."""
    for name in SHADOWS:
        (tmp_path / name).write_text("import os\nos._exit(7)\n")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(
        FLEET_KEY_PREFIX=f"upkids-{uuid.uuid4().hex[:8]}:",
        FLEET_HOSTNAME="kidshost",
        FLEET_API_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    env.update(FLEET_STATE_DIR=str(tmp_path / "state"))
    out = tmp_path / "up.log"
    fleet = Path(sys.executable).parent / "fleet"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [str(fleet), "up"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            preexec_fn=ctrl_c_reaches_it,
        )
    try:
        wait_for(
            lambda: "API on" in out.read_text() or proc.poll() is not None,
            90,
            message="`fleet up` to start its API",
        )
        assert proc.poll() is None, out.read_text()[-3000:]
        yield proc, out, f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _health(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _api_pid(up: subprocess.Popen[bytes]) -> int:
    return _child_pid(up, lambda p: p.cmdline()[-1:] == ["api"])


def _worker_pid(up: subprocess.Popen[bytes], family: str, *, control: bool = False) -> int:
    """The pid of `fleet up`'s worker of ``family`` (its control-only one with ``control``)."""

    def serves(p: Any) -> bool:
        cmd = p.cmdline()
        return (
            "worker" in cmd
            and cmd[cmd.index("--family") + 1] == family
            and ("--control" in cmd) == control
        )

    return _child_pid(up, serves)


def test_fleet_up_is_not_shadowed_names_its_workers_and_restarts_a_dead_api_worker_or_redis(
    tmp_path: Path,
) -> None:
    # (One `fleet up` for the four properties: each start costs ten processes.)
    # Given acp.py and orchestrator.py in the working directory of `fleet up`, which runs on
    # its own embedded Redis
    with _fleet_up(tmp_path) as (up, out, url):
        # Then the API serves and every worker keeps running
        wait_for(lambda: _health(url), 60, message=f"the API to answer:\n{out.read_text()}")
        sid = httpx.post(f"{url}/sessions", json={"cwd": str(tmp_path)}, timeout=10)
        assert sid.status_code in (200, 201), sid.text
        assert up.poll() is None
        assert "had exited" not in out.read_text(), out.read_text()
        # And it names every worker it runs, the control-only ones among them
        said = out.read_text()
        # And the API's output, its access log among it, goes to a log of its own beside the
        # workers', not into what `fleet up` says
        found = re.search(r"API on \S+ \(log (\S+)\)", said)
        assert found, said
        api_log = Path(found.group(1))
        wait_for(lambda: "/sessions" in api_log.read_text(), 10, message="the API's access log")
        assert "/sessions" not in out.read_text()
        assert (
            "workers: turn@kidshost, turn.ctl@kidshost, job@kidshost, subagent@kidshost, "
            "subagent.ctl@kidshost, reminder@kidshost, reminder.ctl@kidshost" in said
        ), said
        # When the API is killed outright
        first = _api_pid(up)
        os.kill(first, signal.SIGKILL)
        # Then `fleet up` says so and starts another, which serves
        wait_for(
            lambda: re.search(
                r"API \(pid \d+\) had exited \(signal SIGKILL\); restarted", out.read_text()
            ),
            30,
            message=f"`fleet up` to restart its API:\n{out.read_text()}",
        )
        wait_for(lambda: _health(url), 60, message=f"the new API to answer:\n{out.read_text()}")
        assert _api_pid(up) != first
        # When the control-only worker is killed outright
        os.kill(_worker_pid(up, "turn", control=True), signal.SIGKILL)
        # Then `fleet up` starts another and says how the first one ended
        wait_for(
            lambda: (
                "worker turn.ctl@kidshost had exited (signal SIGKILL); restarted" in out.read_text()
            ),
            30,
            message=f"`fleet up` to restart its control worker:\n{out.read_text()}",
        )
        assert _worker_pid(up, "turn", control=True) and up.poll() is None
        # When its embedded Redis is killed outright, with a session stored in it
        made = httpx.post(f"{url}/sessions", json={"cwd": str(tmp_path)}, timeout=10)
        assert made.status_code in (200, 201), made.text
        sid = made.json()["sessionId"]
        found = re.search(r"fleet up on (redis://127\.0\.0\.1:\d+/0)", out.read_text())
        assert found, out.read_text()
        os.kill(_child_pid(up, lambda p: p.name().startswith("redis-server")), signal.SIGKILL)
        # Then `fleet up` says so and starts it again on the same address, from its data
        wait_for(
            lambda: (
                f"embedded Redis had exited (signal SIGKILL); restarted on {found.group(1)}"
                in out.read_text()
            ),
            30,
            message=f"`fleet up` to restart its Redis:\n{out.read_text()}",
        )
        wait_for(
            lambda: httpx.get(f"{url}/sessions/{sid}", timeout=5).status_code == 200,
            30,
            message="the session stored before the crash to be served again",
        )
        assert up.poll() is None


def _child_pid(up: subprocess.Popen[bytes], matches: Any) -> int:
    """The pid of the one child of `fleet up` that ``matches`` (a psutil process)."""
    import psutil

    [found] = [p for p in psutil.Process(up.pid).children() if matches(p)]
    return int(found.pid)
