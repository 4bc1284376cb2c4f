"""``fleet demo`` end to end, as a real subprocess on the test Redis.

With ``FLEET_REDIS_URL`` set the demo uses no embedded server and a fresh key prefix of its
own under this run's prefix (``<prefix>demo-<hex>:``), so conftest's cleanup removes its keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


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
    # The demo's worker logs went to FLEET_STATE_DIR, not to the working directory.
    assert (tmp_path / "state" / "demo" / "logs").is_dir(), report
    assert not (tmp_path / ".fleet").exists()
