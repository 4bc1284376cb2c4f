"""``fleet demo`` end to end, as a real subprocess on the test Redis.

With ``FLEET_REDIS_URL`` set the demo uses no embedded server and a fresh key prefix of its
own under this run's prefix (``<prefix>demo-<hex>:``), and deletes its keys when it ends: it
leaves nothing in the operator's Redis. Beside a running ``fleet up`` in the same directory it
runs on an embedded Redis of its own and leaves nothing in that fleet.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.helpers import ctrl_c_reaches_it, wait_for


@pytest.mark.slow
@pytest.mark.integration
def test_demo_passes(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    env = dict(os.environ)
    env.pop("FLEET_API_TOKEN", None)
    env.update(
        FLEET_REDIS_URL=redis_url,
        FLEET_KEY_PREFIX=key_prefix,
        FLEET_STATE_DIR=str(tmp_path / "state"),
        COLUMNS="200",  # rich wraps at 80 columns when not on a terminal
        PYTHONUNBUFFERED="1",
    )
    client = redis.Redis.from_url(redis_url)
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    report = f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    out = proc.stdout
    assert f"prefix '{key_prefix}demo-" in out, report
    for phrase in ("archive refused", "drained", "gate refused", "demo passed"):
        assert phrase in out, f"{phrase!r} missing\n{report}"
    assert "demo failed" not in out, report
    assert "✗" not in out, report
    assert "Traceback" not in proc.stderr, report
    # It leaves no key under its own prefix (under this run's, where the shared fleet's
    # keys come and go meanwhile) and, having passed, no state: its worker logs went to
    # FLEET_STATE_DIR/demo, removed with it.
    found = re.search(rf"prefix '({re.escape(key_prefix)}demo-[0-9a-f]+:)'", out)
    assert found, report
    left = sorted(client.scan_iter(match=f"{found.group(1)}*", count=1000))
    client.close()
    assert left == [], left[:20]
    assert not (tmp_path / "state").exists(), report
    assert not (tmp_path / ".fleet").exists()


@pytest.mark.slow
@pytest.mark.integration
def test_demo_runs_beside_fleet_up_in_the_same_directory_and_leaves_it_nothing(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(COLUMNS="200", PYTHONUNBUFFERED="1", FLEET_HOSTNAME="besidehost")
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "up", "--no-api"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=ctrl_c_reaches_it,
        )
    try:
        wait_for(lambda: "job workers on" in log.read_text(), 90, message="`fleet up` to be ready")
        demo = subprocess.run(
            [sys.executable, "-m", "api.cli", "demo"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert demo.returncode == 0, f"{demo.stdout}\n{demo.stderr[-3000:]}"
        assert "embedded Redis" in demo.stdout
        listed = subprocess.run(
            [sys.executable, "-m", "api.cli", "sessions", "ls", "--all", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == [], "the demo's sessions are not in the fleet"
        assert not (tmp_path / ".fleet" / "demo").exists()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
