"""The tests' own TCP proxy (``tests/tcp_proxy.py``) does the faults it promises, against the
real test Redis."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.tcp_proxy import TcpProxy


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    with TcpProxy.before_redis(redis_url) as found:
        yield found


def _client(proxy: TcpProxy, **kwargs: float) -> redis.Redis:
    # No retries of its own: the fault must reach the caller.
    return redis.Redis(port=proxy.port, retry=None, **kwargs)  # type: ignore[arg-type]


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


def test_freeze_holds_every_byte_until_thawed(proxy: TcpProxy) -> None:
    client = _client(proxy, socket_timeout=0.3)
    try:
        client.ping()
        proxy.freeze()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        proxy.thaw()
        assert client.ping()
    finally:
        client.close()


def test_reset_all_resets_the_open_connections(proxy: TcpProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
        raw.sendall(b"PING\r\n")
        assert raw.recv(64) == b"+PONG\r\n"
        assert proxy.reset_all() == 1
        with pytest.raises(ConnectionResetError):  # an RST, not an orderly close
            raw.recv(64)


def proxy_target(proxy: TcpProxy) -> str:
    host, port = proxy.target
    return f"redis://{host}:{port}"
