"""The tests' own TCP proxy (``tests/tcp_proxy.py``) does the faults it promises, against the
real test Redis."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import redis

from tests.tcp_proxy import TcpProxy


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    with TcpProxy.before_redis(redis_url) as found:
        yield found


def _client(proxy: TcpProxy, **kwargs: float) -> redis.Redis:
    # No retries of its own: the fault must reach the caller.
    return redis.Redis.from_url(proxy.url, retry=None, **kwargs)


def _raw(proxy: TcpProxy) -> socket.socket:
    """A raw connection through the proxy that has had its PING answered."""
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    raw.sendall(b"PING\r\n")
    assert raw.recv(64) == b"+PONG\r\n"
    return raw


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_url_and_before_redis_keep_the_database(redis_url: str) -> None:
    proxy = TcpProxy.before_redis("redis://127.0.0.1:6379/3")
    try:
        assert proxy.target == ("127.0.0.1", 6379)
        assert proxy.url == f"redis://127.0.0.1:{proxy.port}/3"
    finally:
        proxy.stop()
    with TcpProxy(urlsplit(redis_url).port or 6379) as plain:
        assert plain.url == f"redis://127.0.0.1:{plain.port}/0"
        client = _client(plain)
        try:
            assert client.ping()
        finally:
            client.close()


def test_cut_after_applies_the_request_and_loses_its_reply(
    proxy: TcpProxy, key_prefix: str
) -> None:
    key = f"{key_prefix}proxy:{uuid.uuid4().hex}"
    client, direct = _client(proxy), redis.Redis.from_url(str(proxy_target(proxy)))
    try:
        client.ping()
        cut = proxy.cut_after(key.encode())
        with pytest.raises(redis.ConnectionError):
            client.set(key, "1")
        assert cut.done.wait(10) and cut.count == 1
        assert direct.get(key) == b"1"  # applied, though its client never heard it
        assert client.ping()  # one cut only: a new connection passes
    finally:
        direct.delete(key)
        client.close()
        direct.close()


def test_freeze_all_holds_every_byte_until_thawed(proxy: TcpProxy) -> None:
    client = _client(proxy, socket_timeout=0.3)
    later = _client(proxy, socket_timeout=0.3)
    try:
        client.ping()
        proxy.freeze_all()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        with pytest.raises(redis.TimeoutError):  # a connection opened since is held too
            later.ping()
        assert proxy.live() == 0
        proxy.thaw()
        assert client.ping()
        assert later.ping()
    finally:
        client.close()
        later.close()


def test_freeze_open_silences_the_open_connections_and_lets_new_ones_pass(
    proxy: TcpProxy,
) -> None:
    client = _client(proxy, socket_timeout=0.3)
    try:
        client.ping()
        assert proxy.live() == 1
        assert proxy.freeze_open() == 1
        assert proxy.live() == 0 and proxy.connections() == 1
        with pytest.raises(redis.TimeoutError):
            client.ping()
        assert proxy.freeze_open() == 0  # nothing live left to freeze
        with _raw(proxy):  # a new connection is forwarded
            assert proxy.live() == 1
        proxy.thaw()
        client.connection_pool.disconnect()  # its reply to the timed-out PING is stale
        assert client.ping()
    finally:
        client.close()


def test_close_frozen_closes_the_connections_frozen_long_enough(proxy: TcpProxy) -> None:
    with _raw(proxy) as frozen, _raw(proxy) as fresh:
        assert proxy.freeze_open() == 2
        assert proxy.close_frozen(older_than=60) == 0  # not frozen that long
        fresh.sendall(b"PING\r\n")  # held: frozen is frozen, whatever is sent
        assert proxy.close_frozen() == 2
        assert frozen.recv(64) == b""  # an orderly close (FIN), no reset
        assert fresh.recv(64) == b""
        assert _until(lambda: proxy.connections() == 0)


def test_a_frozen_connection_whose_client_closed_is_released(proxy: TcpProxy) -> None:
    raw = _raw(proxy)
    assert proxy.freeze_open() == 1
    raw.close()
    assert _until(lambda: proxy.connections() == 0)
    assert proxy.close_frozen() == 0


def test_reset_all_resets_the_open_connections(proxy: TcpProxy) -> None:
    with _raw(proxy) as live, _raw(proxy) as frozen:
        proxy.freeze_open()
        with _raw(proxy):
            assert proxy.reset_all() == 3  # frozen or not
        with pytest.raises(ConnectionResetError):  # an RST, not an orderly close
            live.recv(64)
        with pytest.raises(ConnectionResetError):
            frozen.recv(64)


def test_forwards_with_descriptors_past_select_limit(proxy: TcpProxy) -> None:
    # select() fails on a descriptor past 1024; the soak's proxy holds more than that.
    with contextlib.ExitStack() as stack:
        try:
            while True:
                held = stack.enter_context(open("/dev/null", "rb"))  # noqa: SIM115
                if held.fileno() > 1100:
                    break
        except OSError:
            pytest.skip("too few descriptors to be had")
        with _raw(proxy) as raw:
            assert raw.fileno() > 1024
            raw.sendall(b"PING\r\n")
            assert raw.recv(64) == b"+PONG\r\n"


def proxy_target(proxy: TcpProxy) -> str:
    host, port = proxy.target
    return f"redis://{host}:{port}"
