"""A TCP proxy of the tests' own, between a client process and a server on loopback, that
makes the faults a network makes without announcing them:

- ``freeze()`` / ``thaw()``: nothing passes either way and nothing is closed (a peer that
  vanished, a NAT that dropped the flow), until thawed;
- ``reset_all()``: every open connection is reset (RST to both ends);
- ``cut_after(pattern)``: the next request that carries ``pattern`` (bytes, e.g. a Lua
  script's SHA-1 in an ``EVALSHA``) is forwarded whole to the server, and once the server's
  reply begins to come back, that connection is reset instead of passing it on: the request
  was applied, its client never learns it.

Usage::

    with TcpProxy(6379) as proxy:          # listens on 127.0.0.1:proxy.port
        cut = proxy.cut_after(sha.encode())
        ...                                # the client talks to proxy.port
        assert cut.done.wait(10)
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit

#: Bytes of a connection's last read kept to find a pattern that straddles two reads.
_TAIL = 4096


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (no FIN): linger 0. ``SHUT_RD`` first wakes a thread of
    ours blocked reading it, without sending anything to the peer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()


def _close(sock: socket.socket) -> None:
    """Close ``sock`` in order (FIN), waking a thread of ours blocked reading it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@dataclass
class Cut:
    """An armed ``cut_after``: ``pattern``, the ``times`` it still cuts, and ``done``, set
    each time a connection was cut (``count`` of them)."""

    pattern: bytes
    times: int
    done: threading.Event = field(default_factory=threading.Event)
    count: int = 0


class _Link:
    """One proxied connection: the client's socket and ours to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.lock = threading.Lock()
        self.closed = False
        #: The cut that dooms this connection: its server's next reply is not passed on.
        self.doomed: Cut | None = None

    def end(self, *, rst: bool) -> bool:
        """Close both ends (with RST or FIN) unless already closed; whether this call did."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
        for sock in (self.client, self.server):
            (_reset if rst else _close)(sock)
        return True


class TcpProxy:
    """Listens on a free port of 127.0.0.1 and forwards each connection to
    ``target_host:target_port``; see the module docstring for the faults it makes."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._links: list[_Link] = []
        self._cuts: list[Cut] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = False
        self._threads: list[threading.Thread] = []
        #: With ``before_redis``: the Redis URL that goes through this proxy.
        self.redis_url = ""

    @classmethod
    def before_redis(cls, redis_url: str) -> TcpProxy:
        """A proxy (not started) to the Redis of a ``redis://host:port/db`` URL; its
        ``redis_url`` is the URL to give the clients instead."""
        target = urlsplit(redis_url)
        proxy = cls(target.port or 6379, target.hostname or "127.0.0.1")
        proxy.redis_url = f"redis://127.0.0.1:{proxy.port}{target.path}"
        return proxy

    # -- the faults ----------------------------------------------------------------------------
    def freeze(self) -> None:
        """From now on no byte passes either way (what was read is held); nothing closes."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Let the held bytes and what follows pass again."""
        self._flowing.set()

    def reset_all(self) -> int:
        """Reset every open connection (RST to the client and to the server); how many."""
        with self._lock:
            links, self._links = self._links, []
        return sum(link.end(rst=True) for link in links)

    def cut_after(self, pattern: bytes, times: int = 1) -> Cut:
        """Arm a cut: the next ``times`` requests carrying ``pattern`` reach the server, and
        each one's connection is reset when the server's reply to it begins, before the
        client gets a byte of it."""
        cut = Cut(pattern, times)
        with self._lock:
            self._cuts.append(cut)
        return cut

    @property
    def connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return sum(not link.closed for link in self._links)

    # -- running ---------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        """Start accepting (a daemon thread)."""
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection (FIN)."""
        self._stopped = True
        self._flowing.set()
        _close(self._listener)
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.end(rst=False)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            self._spawn(self._upstream, link)
            self._spawn(self._downstream, link)

    def _armed(self, window: bytes) -> Cut | None:
        """The armed cut whose pattern ``window`` holds, now spent once."""
        with self._lock:
            for cut in self._cuts:
                if cut.times > 0 and cut.pattern in window:
                    cut.times -= 1
                    return cut
        return None

    def _upstream(self, link: _Link) -> None:
        """Client to server; spots the requests a cut waits for."""
        tail = b""
        while True:
            try:
                data = link.client.recv(65536)
            except OSError:
                break
            if not data:
                break
            self._flowing.wait()
            window = tail + data
            tail = window[-_TAIL:]  # a pattern split between two reads is still seen
            cut = self._armed(window) if link.doomed is None else None
            if cut is not None:
                link.doomed = cut
            try:
                link.server.sendall(data)
            except OSError:
                break
        link.end(rst=False)

    def _downstream(self, link: _Link) -> None:
        """Server to client; a doomed connection is reset at its reply's first byte."""
        while True:
            try:
                data = link.server.recv(65536)
            except OSError:
                break
            if not data:
                break
            self._flowing.wait()
            cut = link.doomed
            if cut is not None:
                if link.end(rst=True):
                    cut.count += 1
                    cut.done.set()
                return
            try:
                link.client.sendall(data)
            except OSError:
                break
        link.end(rst=False)
