"""A durable script write (``Store.run(durable=True)``) where the server confirms fsyncs
(``WAITAOF``, Redis >= 7.2) or replicas must acknowledge (``WAIT``) goes out as one pipeline:
the script by its digest and the waits after it, one round trip. The server here may lack
``WAITAOF``; the store is told to ask anyway (``_waitaof = None``), so the pipeline is sent as it
would be to a server that has it (the missing command's error then says so, as in production).
A server that lost its scripts (a restart, a failover, ``SCRIPT FLUSH``) is played by giving the
store's script a digest the server never saw: flushing the test server would pull the scripts
from under every other test running beside these."""

from __future__ import annotations

import pytest

from orchestrator.models import usage
from orchestrator.models.model import Usage
from orchestrator.session.sessions import create_session, get_session
from orchestrator.storage.store import Store
from tests.helpers import count_round_trips

#: A digest no script has: the server answers NOSCRIPT, as after losing its cache.
UNKNOWN_SHA = "0" * 40

pytestmark = pytest.mark.redis


def _durable_title(store: Store, sid: str, title: str) -> str:
    store._waitaof = None  # ask for WAITAOF, as with a server that has it
    outcome: str = store.run("set_title", [sid, title, "client"], durable=True)
    return outcome


def test_a_durable_write_is_one_round_trip_with_its_wait(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session, and the title script already loaded on the server
    sid = create_session(store, "/tmp/durable").session_id
    _durable_title(store, sid, "first")
    # When a durable write goes through the pipeline that carries its WAITAOF
    writes = count_round_trips(monkeypatch)
    _durable_title(store, sid, "second")
    monkeypatch.undo()
    # Then the script and the wait went in one write, with no SCRIPT EXISTS before it
    assert len(writes) == 1, [w[:60] for w in writes]
    assert b"EVALSHA" in writes[0] and b"WAITAOF" in writes[0]
    assert get_session(store, sid).title == "second"


def test_a_durable_write_after_the_servers_scripts_were_flushed_still_lands(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session, and a server that lost its script cache since (as after a restart)
    sid = create_session(store, "/tmp/durable").session_id
    _durable_title(store, sid, "first")
    store.script("set_title").sha = UNKNOWN_SHA
    # When a durable write goes through the pipeline
    writes = count_round_trips(monkeypatch)
    _durable_title(store, sid, "after the flush")
    monkeypatch.undo()
    # Then the script was loaded and the write made once: the refused EVALSHA, the load, the
    # write again
    assert [w.count(b"EVALSHA") + w.count(b"SCRIPT") for w in writes] == [1, 1, 1]
    assert get_session(store, sid).title == "after the flush"


def test_a_steps_usage_is_counted_in_one_round_trip(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session, and the usage script already loaded on the server
    sid = create_session(store, "/tmp/durable").session_id
    usage.record(store, sid, "turn-usage-1", Usage(3, 4), "ok", 0.5)
    # When a step's usage is recorded
    writes = count_round_trips(monkeypatch)
    usage.record(store, sid, "turn-usage-1", Usage(10, 20), "ok", 0.5)
    monkeypatch.undo()
    # Then its counts and its totals went in one write, the script by its digest
    assert len(writes) == 1, [w[:60] for w in writes]
    assert b"EVALSHA" in writes[0]
    assert get_session(store, sid).usage == {"inputTokens": 13, "outputTokens": 24}


def test_a_steps_usage_is_counted_after_the_servers_scripts_were_flushed(
    store: Store,
) -> None:
    # Given a session whose usage was counted once, and a server that lost its scripts since
    sid = create_session(store, "/tmp/durable").session_id
    usage.record(store, sid, "turn-usage-2", Usage(1, 1), "ok", 0.5)
    store.script("usage_add").sha = UNKNOWN_SHA
    # When the next step's usage is recorded
    usage.record(store, sid, "turn-usage-2", Usage(5, 6), "ok", 0.5)
    # Then it was counted once, not lost and not twice, and the script is known by its digest
    assert get_session(store, sid).usage == {"inputTokens": 6, "outputTokens": 7}
    assert store.script("usage_add").sha != UNKNOWN_SHA
