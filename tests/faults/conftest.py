"""Fixtures of the fault tests: a private Redis the test may kill and restart."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from localfleet.embedded import EmbeddedRedis
from orchestrator.storage.store import Store


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """An ``EmbeddedRedis`` (append-only, ``appendfsync always``) of this test alone, on a
    fixed port so that it comes back on the same address after a restart. Never the shared
    test Redis: tests may stop, kill and restart it at will."""
    server = EmbeddedRedis(tmp_path / "state", port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def assert_consistent(store: Store, session_ids: Iterable[str] | None = None) -> None:
    """The archive state is whole: the ``archived`` set, each session hash's ``archived``
    flag and the listing indexes (fleet-wide and per cwd) agree, and no session with an
    archived ancestor is itself unarchived (the gate's invariant, ``orchestrator/session/gate.py``).
    Checks ``session_ids``, or every session under the store's prefix."""
    k = store.keys
    members = set(store.redis.smembers(k.archived))
    flagged: set[str] = set()
    live: set[str] = set()
    keys = (
        store.redis.scan_iter(match=f"{k.prefix}session:*", count=1000)
        if session_ids is None
        else [k.session(sid) for sid in session_ids]
    )
    for key in keys:
        h = store.redis.hgetall(key)
        sid = key.removeprefix(f"{k.prefix}session:")
        if h.get("deleted") != "0":
            continue
        live.add(sid)
        if h.get("archived") == "1":
            flagged.add(sid)
        in_archived = store.redis.zscore(k.index("archived"), sid) is not None
        in_active = store.redis.zscore(k.index("active"), sid) is not None
        cwd_archived = store.redis.zscore(k.index("archived", h["cwdHash"]), sid) is not None
        cwd_active = store.redis.zscore(k.index("active", h["cwdHash"]), sid) is not None
        want = h.get("archived") == "1"
        assert (in_archived, in_active, cwd_archived, cwd_active) == (
            want,
            not want,
            want,
            not want,
        ), f"{sid}: indexes disagree with archived={h.get('archived')}"
        if not want:
            for ancestor in store.redis.lrange(k.lineage(sid), 0, -1):
                assert ancestor not in members, f"{sid} is active under archived {ancestor}"
    assert members & live == flagged, (
        f"archived set vs flags: only in set {members & live - flagged}, "
        f"only flagged {flagged - members}"
    )
