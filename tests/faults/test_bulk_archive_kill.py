"""A bulk archive killed mid-run leaves no archive unaudited or uncounted.

A real ``fleet api`` process (on a key prefix of this test alone) runs a bulk archive of a few
thousand sessions and is SIGKILLed by PID in the middle. The kill is aimed: the test watches
the archived set and the audit trail in one atomic read and kills the API the moment it sees
more sessions archived than audited (only possible while a batch is written but not yet
recorded), or once a third of the sessions are archived, whichever comes first."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.archiving import bulk
from orchestrator.session.sessions import create_session
from orchestrator.storage import audit, metrics
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, http_ok, wait_until_up

pytestmark = pytest.mark.timeout(180)

SESSIONS = 3_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Api:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log


@pytest.fixture
def private(own_store: Store) -> Store:
    """A store on a prefix of this test alone."""
    return own_store


@pytest.fixture
def api(private: Store, redis_url: str, tmp_path: Path) -> Iterator[Api]:
    """``fleet api`` on a free port, on the private prefix."""
    port = _free_port()
    env = dict(os.environ, FLEET_REDIS_URL=redis_url, FLEET_KEY_PREFIX=private.keys.prefix)
    env.pop("FLEET_API_TOKEN", None)
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(lambda: http_ok(f"{url}/health"), proc, "fleet api", log.read_text)
        yield Api(proc, url, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _archived_and_audited(store: Store) -> tuple[int, int]:
    """Sessions archived and audit entries written, read atomically (one MULTI)."""
    pipe = store.redis.pipeline(transaction=True)
    pipe.scard(store.keys.archived)
    pipe.xlen(store.keys.audit_all)
    archived, audited = pipe.execute()
    return int(archived), int(audited)


def _archive_entries(store: Store, ids: list[str]) -> dict[str, list[str]]:
    """Per session, the outcomes of its bulk-archive audit entries (its whole trail: the list
    and the entries waiting in bulk batches, as ``audit.read`` merges them)."""
    return {
        sid: [
            e["outcome"]
            for e in audit.read(store, sid, count=audit.MAX_READ)
            if e["action"] == "bulk_archive"
        ]
        for sid in ids
    }


def _counted(store: Store, outcome: str) -> int:
    return int(store.redis.hget(store.keys.metric(metrics.ARCHIVES.name), outcome) or 0)


def test_a_bulk_archive_killed_mid_run_has_every_archive_audited_and_counted(
    private: Store, api: Api
) -> None:
    store = private
    # Given a few thousand idle sessions
    ids = [create_session(store, "/tmp/faults-bulk").session_id for _ in range(SESSIONS)]

    # When a real API process archives them in bulk (stopActivity) ...
    def request() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the API is killed under it
            httpx.post(
                f"{api.url}/sessions/archive",
                json={"sessionIds": ids, "stopActivity": True},
                timeout=120,
            )

    sender = threading.Thread(target=request, daemon=True)
    sender.start()
    # ... and is SIGKILLed by PID in the middle of the run
    deadline = time.monotonic() + 60
    while True:
        archived, audited = _archived_and_audited(store)
        if archived and (archived != audited or archived >= SESSIONS // 3):
            api.proc.send_signal(signal.SIGKILL)
            break
        assert api.proc.poll() is None, api.log.read_text()
        assert time.monotonic() < deadline, "the bulk archive did not start within 60 s"
    api.proc.wait(10)
    sender.join(30)
    archived_ids = [sid for sid in ids if store.redis.sismember(store.keys.archived, sid)]
    assert 0 < len(archived_ids) < SESSIONS, "the kill did not land mid-run"

    # Then every archived session has exactly one audit entry for its archive, and the
    # archive count equals the sessions archived
    entries = _archive_entries(store, ids)
    unaudited = [sid for sid in archived_ids if entries[sid] != ["archived"]]
    assert unaudited == [], f"{len(unaudited)} of {len(archived_ids)} archived sessions"
    assert all(entries[sid] == [] for sid in ids if sid not in set(archived_ids))
    assert _counted(store, "archived") == len(archived_ids)

    # When the bulk archive is retried to the end
    result = bulk.bulk_archive(store, RecordingDispatcher(), session_ids=ids, stop_activity=True)

    # Then each session is archived once in the trail and the counts add up
    assert result.totals["already_archived"] == len(archived_ids)
    assert result.totals["archived"] == SESSIONS - len(archived_ids)
    after = _archive_entries(store, ids)
    assert sum(o.count("archived") for o in after.values()) == SESSIONS
    assert all(o.count("archived") == 1 for o in after.values())
    assert _counted(store, "archived") == SESSIONS
    assert _counted(store, "already_archived") == len(archived_ids)
