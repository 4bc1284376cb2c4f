"""Best-effort bookkeeping after a response (``orchestrator/storage/bookkeeping.py``): what is
queued
within the window is written in one round trip, in order; a failed write is logged and the
thread goes on; ``close`` writes what is queued; after it, entries are written at once."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from orchestrator.storage.bookkeeping import Bookkeeper, Fill
from orchestrator.storage.store import Store
from tests.helpers import count_round_trips, wait_for

pytestmark = pytest.mark.redis


def _append(key: str, value: str) -> Fill:
    def fill(pipe: Any) -> None:
        pipe.rpush(key, value)

    return fill


def _key(store: Store) -> str:
    return f"{store.keys.prefix}test:bookkeeping:{uuid.uuid4().hex}"


def test_what_is_queued_within_the_window_is_one_write_in_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _key(store)
    keeper = Bookkeeper(store, window=0.5)
    try:
        # Given five entries queued one after the other
        writes = count_round_trips(monkeypatch)
        for n in range(5):
            keeper.submit(_append(key, str(n)))
        # When they are written
        wait_for(lambda: store.redis.llen(key) == 5, 10, message="the five entries")
        monkeypatch.undo()
        # Then one round trip carried all five, in the order queued (the other writes are this
        # test's polls and the thread's connection handshake)
        carried = [w.count(b"RPUSH") for w in writes if b"RPUSH" in w]
        assert carried == [5], [w[:60] for w in writes]
        assert store.redis.lrange(key, 0, -1) == ["0", "1", "2", "3", "4"]
    finally:
        keeper.close()


def test_a_failed_write_is_logged_and_later_entries_are_still_written(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    key, plain = _key(store), _key(store)
    store.redis.set(plain, "not a list")
    keeper = Bookkeeper(store, window=0.01)
    try:
        # Given an entry whose write fails (a list command on a string)
        with caplog.at_level(logging.WARNING, logger="orchestrator.storage.bookkeeping"):
            keeper.submit(_append(plain, "x"))
            wait_for(lambda: "bookkeeping not written" in caplog.text, 10, message="the warning")
        # When another entry is queued after it
        keeper.submit(_append(key, "after"))
        # Then it is written
        wait_for(lambda: store.redis.lrange(key, 0, -1) == ["after"], 10, message="the entry")
    finally:
        keeper.close()


def test_close_writes_what_is_queued_and_later_entries_are_written_at_once(
    store: Store,
) -> None:
    key = _key(store)
    # Given an entry queued with a long window
    keeper = Bookkeeper(store, window=30)
    keeper.submit(_append(key, "queued"))
    # When the keeper closes (at the application's shutdown)
    keeper.close()
    # Then the entry is written without waiting out the window, and an entry submitted after
    # the close is written before submit returns
    assert store.redis.lrange(key, 0, -1) == ["queued"]
    keeper.submit(_append(key, "late"))
    assert store.redis.lrange(key, 0, -1) == ["queued", "late"]
