"""A write whose outcome is unknown is told apart from one that was never sent
(``orchestrator/storage/idempotency.py``): the store's connection goes through a ``TcpProxy`` that
resets it after the creating script ran, or there is no server to connect to at all."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pytest

from orchestrator.archiving import deletion
from orchestrator.errors import SessionNotFound, StoreUnavailable, WriteOutcomeUnknown
from orchestrator.session import sessions
from orchestrator.storage import idempotency
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import Delivering
from tests.tcp_proxy import TcpProxy


@pytest.fixture
def proxied(redis_url: str, store: Store) -> Iterator[tuple[Store, TcpProxy]]:
    """A store on the run's prefix whose connection goes through a ``TcpProxy``."""
    with TcpProxy.before_redis(redis_url) as proxy:
        s = Store(proxy.url, store.keys.prefix)
        try:
            yield s, proxy
        finally:
            s.close()


def _cut(store: Store, proxy: TcpProxy, script: str) -> None:
    loaded = store.script(script)
    store.redis.script_load(loaded.script)
    proxy.cut_after(str(loaded.sha).encode())


def _cwd() -> str:
    return f"/tmp/fleet-idem-unknown/{uuid.uuid4().hex}"


def test_a_creation_whose_reply_was_lost_says_it_may_have_been_applied(
    proxied: tuple[Store, TcpProxy], store: Store
) -> None:
    via, proxy = proxied
    cwd = _cwd()
    _cut(store, proxy, "create_session")
    with pytest.raises(WriteOutcomeUnknown) as caught:
        sessions.create_session(via, cwd)
    # It was applied; without a key the error says how to check before retrying.
    assert len(sessions.list_sessions(store, cwd=cwd).sessions) == 1
    assert caught.value.data["idempotencyKey"] is False
    assert "list the sessions in that cwd" in caught.value.message
    assert "may have been applied" in caught.value.message


def test_a_prompt_whose_reply_was_lost_says_it_may_have_been_applied(
    proxied: tuple[Store, TcpProxy], store: Store
) -> None:
    via, proxy = proxied
    sid = sessions.create_session(store, _cwd()).session_id
    _cut(store, proxy, "turn_create")
    with pytest.raises(WriteOutcomeUnknown) as caught:
        turns.start_turn(via, RecordingDispatcher(), sid, "say hi", idempotency_key="k-1")
    assert store.redis.zcard(store.keys.live_turns(sid)) == 1
    assert caught.value.data == {
        "outcome": "unknown",
        "idempotencyKey": True,
        "check": caught.value.data["check"],
    }
    assert "same idempotency key" in caught.value.message
    # The retry with the key answers the stored turn.
    [stored] = store.redis.zrange(store.keys.live_turns(sid), 0, -1)
    assert turns.start_turn(via, RecordingDispatcher(), sid, "say hi", idempotency_key="k-1") == (
        stored
    )


def test_a_creation_whose_read_back_fails_says_it_may_have_been_applied(
    proxied: tuple[Store, TcpProxy], store: Store
) -> None:
    # Given a store whose every read of a session hash is cut (the create script's reply
    # arrives; the reads after it never do, as when Redis stalls right after the write)
    via, proxy = proxied
    cwd = _cwd()
    cut = proxy.cut_after(b"HGETALL", times=1000)
    # When a session is created without a key
    with pytest.raises(WriteOutcomeUnknown) as caught:
        sessions.create_session(via, cwd)
    # Then it was created, and the answer says it may have been, never "nothing was sent"
    assert cut.count > 0, "no read was cut"
    assert len(sessions.list_sessions(store, cwd=cwd).sessions) == 1
    assert "may have been applied" in caught.value.message
    assert caught.value.data["idempotencyKey"] is False


def test_a_prompt_replayed_after_its_session_was_deleted_is_not_found(store: Store) -> None:
    # Given a prompt sent with a key, then its session deleted
    sid = sessions.create_session(store, _cwd()).session_id
    dispatcher = RecordingDispatcher()
    turns.start_turn(store, dispatcher, sid, "say hi", idempotency_key="k-del")
    deletion.delete(store, Delivering(store), sid, stop_activity=True)
    assert sessions.get_session(store, sid, include_deleted=True).deleted
    # When the prompt is retried with its key
    # Then the answer is the deleted session's, as a replayed creation of it answers
    with pytest.raises(SessionNotFound):
        turns.start_turn(store, dispatcher, sid, "say hi", idempotency_key="k-del")


def test_a_write_never_sent_is_a_plain_store_unavailable(store: Store) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = Store(f"redis://127.0.0.1:{port}/0", store.keys.prefix, connect_timeout=0.5)
    try:
        with (
            pytest.raises(StoreUnavailable) as caught,
            idempotency.outcome_unknown("session creation", "look", keyed=True),
        ):
            down.run("create_session", [])  # the connection is refused: nothing was sent
        assert not isinstance(caught.value, WriteOutcomeUnknown)
        assert "connecting to" in str(caught.value.__cause__)
    finally:
        down.close()
