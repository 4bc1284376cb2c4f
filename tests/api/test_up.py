"""`fleet up` runs a whole local fleet on an embedded Redis, publishes where it runs so the
other commands run in the same directory find it, and tears it all down on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from tests.helpers import ctrl_c_reaches_it, wait_for


def test_fleet_up_starts_an_embedded_redis_and_every_family_then_stops_them_all(
    tmp_path: Path,
) -> None:
    # Given no Redis URL configured
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(
        FLEET_KEY_PREFIX="upcheck:",
        FLEET_HOSTNAME="uphost",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",  # SIGABRT prints where each of its threads is
    )
    out = tmp_path / "up.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "up", "--no-api"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            preexec_fn=ctrl_c_reaches_it,
        )
    try:
        # When it is up
        # (it says where it published itself last, once the API has started too)
        line = wait_for(
            lambda: re.search(r"fleet up on (redis://\S+)[\s\S]*published in ", out.read_text()),
            90,
            message="`fleet up` to report its Redis and publish itself",
        )
        url = line.group(1)
        client = redis.Redis.from_url(url, decode_responses=True)
        # Then an embedded, append-only Redis answers and every family has a live worker,
        # the turn, subagent and reminder families a control-only one beside it
        assert client.config_get("appendonly")["appendonly"] == "yes"
        beats = client.keys("upcheck:worker:*")
        assert {b.split(":")[2] for b in beats} == {
            "turn",
            "turn.ctl",
            "job",
            "subagent",
            "subagent.ctl",
            "reminder",
            "reminder.ctl",
        }
        server_pids = [
            p.pid
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "redis-server" in p.name()
        ]
        assert server_pids
        children = psutil.Process(proc.pid).children(recursive=True)
        client.close()
        # And the commands run in the same directory, with no FLEET_REDIS_URL, find it
        published = json.loads((tmp_path / ".fleet" / "fleet.json").read_text())
        assert published["redisUrl"] == url and published["keyPrefix"] == "upcheck:"
        sid = _fleet(tmp_path, env, "sessions", "new", str(tmp_path)).stdout.strip()
        listed = json.loads(_fleet(tmp_path, env, "sessions", "ls", "--json").stdout)
        assert [s["sessionId"] for s in listed] == [sid]
    finally:
        # When Ctrl-C arrives
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(10)
            pytest.fail(
                f"`fleet up` still ran 60 s after Ctrl-C; its log:\n{out.read_text()[-3000:]}"
            )
    # Then it exits cleanly and leaves no worker or Redis behind
    assert code == 0, out.read_text()[-2000:]
    # It is no longer published, and a command says exactly what to do
    assert not (tmp_path / ".fleet" / "fleet.json").exists()
    lost = _fleet(tmp_path, env, "sessions", "ls", check=False)
    assert lost.returncode == 2
    said = " ".join(lost.stderr.split())
    assert "FLEET_REDIS_URL is not set and no `fleet up` runs" in said, said
    assert "run `fleet up` in this directory" in said and "Traceback" not in said, said
    deadline = time.monotonic() + 10
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        assert time.monotonic() < deadline, [c.pid for c in children if c.is_running()]
        time.sleep(0.1)


def _fleet(
    cwd: Path, env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert not check or proc.returncode == 0, (args, proc.returncode, proc.stderr)
    return proc
