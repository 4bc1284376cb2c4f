"""A TCP proxy of the tests' own, between client processes and a server on loopback, that
makes the faults a network makes without announcing them. Used by the fault tests and the
fault soak (``bench/soak``).

- ``freeze_open()``: the connections open now go silent for good (nothing forwarded either
  way, nothing closed or reset: a peer that vanished, a hung host, a NAT that dropped the
  flow), while connections opened afterwards are forwarded as usual;
- ``freeze_all()``: every connection, open now or opened later, goes silent;
- ``thaw()``: undoes both freezes; what the peers sent meanwhile is forwarded then;
- ``close_frozen(older_than)``: connections frozen that long are closed (FIN both ways), as a
  peer's kernel does once it gives up on them;
- ``reset_all()``: every open connection is reset (RST to both ends);
- ``cut_after(pattern)``: the next request that carries ``pattern`` (bytes, e.g. a Lua
  script's SHA-1 in an ``EVALSHA``) is forwarded whole to the server, and once the server's
  reply begins to come back, that connection is reset instead of passing it on: the request
  was applied, its client never learns it.

A frozen connection whose client closed its end (it gave up on the silence) is released.

Threads and sockets only: one thread accepts, one thread per connection forwards both ways,
waiting with ``poll`` (not ``select``: a process holding many frozen connections has
descriptors past select's limit of 1024). Usage::

    with TcpProxy.before_redis("redis://127.0.0.1:6379/0") as proxy:
        url = proxy.url                    # redis://127.0.0.1:<proxy port>/0
        cut = proxy.cut_after(sha.encode())
        ...
        assert cut.done.wait(10)
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

#: Seconds a forwarding thread waits on its sockets before it looks at its state again (how
#: soon a freeze, a thaw or a close from another thread is seen).
_TICK = 0.1
#: poll events of a peer that closed its end, even with data still unread (Linux); 0 elsewhere.
_HUNG_UP = getattr(select, "POLLRDHUP", 0)
#: Bytes of a connection's last read kept to find a pattern that straddles two reads.
_TAIL = 4096
#: Seconds ``stop`` waits, in all, for the proxy's threads to end.
_JOIN = 5.0


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (no FIN): linger 0. ``SHUT_RD`` first wakes a thread of
    ours waiting on it, without sending anything to the peer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()


def _close(sock: socket.socket) -> None:
    """Close ``sock`` in order (FIN), waking a thread of ours waiting on it."""
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


class _Pair:
    """One proxied connection: the client's socket and ours to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.opened_at = time.monotonic()
        #: When ``freeze_open`` froze it (``time.monotonic()``), or None.
        self.frozen_at: float | None = None
        #: The cut that dooms this connection: its server's next reply is not passed on.
        self.doomed: Cut | None = None
        self.closed = threading.Event()
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def end(self, *, rst: bool) -> bool:
        """Close both ends (with RST or FIN) unless already closed; whether this call did."""
        with self._lock:
            if self.closed.is_set():
                return False
            self.closed.set()
        for sock in (self.client, self.server):
            (_reset if rst else _close)(sock)
        return True


class TcpProxy:
    """Listens on a free port of 127.0.0.1 and forwards each connection to
    ``target_host:target_port``; see the module docstring for the faults it makes. A context
    manager (``start`` on enter, ``stop`` on exit)."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._path = "/0"
        self._pairs: set[_Pair] = set()
        self._cuts: list[Cut] = []
        self._lock = threading.Lock()
        #: When ``freeze_all`` froze everything (``time.monotonic()``), or None.
        self._all_frozen_at: float | None = None
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    @classmethod
    def before_redis(cls, redis_url: str) -> TcpProxy:
        """A proxy (not started) to the Redis of a ``redis://host:port/db`` URL; its ``url``
        is the same URL through the proxy."""
        target = urlsplit(redis_url)
        proxy = cls(target.port or 6379, target.hostname or "127.0.0.1")
        proxy._path = target.path or "/0"
        return proxy

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<proxy port>/<db>``: the target Redis through the proxy (db 0
        unless ``before_redis`` named another)."""
        return f"redis://127.0.0.1:{self.port}{self._path}"

    # -- the faults ----------------------------------------------------------------------------
    def freeze_open(self) -> int:
        """Stop forwarding on every connection open and forwarding now, until ``thaw``: bytes
        sent to the proxy are neither forwarded nor answered, and neither side is closed or
        reset. Connections opened later are forwarded. Returns how many it froze."""
        now = time.monotonic()
        with self._lock:
            live = [p for p in self._pairs if self._frozen_since(p) is None]
            for pair in live:
                pair.frozen_at = now
        return len(live)

    def freeze_all(self) -> None:
        """From now on, until ``thaw``, no byte passes either way on any connection, open now
        or opened later (new ones are still accepted); nothing closes."""
        with self._lock:
            if self._all_frozen_at is None:
                self._all_frozen_at = time.monotonic()

    def thaw(self) -> None:
        """Undo ``freeze_open`` and ``freeze_all``: every open connection forwards again,
        what was sent meanwhile first (within ``_TICK`` seconds)."""
        with self._lock:
            self._all_frozen_at = None
            for pair in self._pairs:
                pair.frozen_at = None

    def close_frozen(self, older_than: float = 0.0) -> int:
        """Close (FIN, both ways) every connection frozen at least ``older_than`` seconds ago
        (by either freeze): what a peer's kernel does once it gives up. Returns how many."""
        now = time.monotonic()
        with self._lock:
            since = [(p, self._frozen_since(p)) for p in self._pairs]
        old = [p for p, at in since if at is not None and now - at >= older_than]
        return sum(pair.end(rst=False) for pair in old)

    def reset_all(self) -> int:
        """Reset every open connection, frozen or not (RST to the client and to the server);
        how many."""
        with self._lock:
            pairs = list(self._pairs)
        return sum(pair.end(rst=True) for pair in pairs)

    def cut_after(self, pattern: bytes, times: int = 1) -> Cut:
        """Arm a cut: the next ``times`` requests carrying ``pattern`` reach the server, and
        each one's connection is reset when the server's reply to it begins, before the
        client gets a byte of it."""
        cut = Cut(pattern, times)
        with self._lock:
            self._cuts.append(cut)
        return cut

    # -- counts --------------------------------------------------------------------------------
    def connections(self) -> int:
        """Connections open now, frozen or not."""
        with self._lock:
            return sum(not p.closed.is_set() for p in self._pairs)

    def live(self) -> int:
        """Connections open and forwarding (not frozen)."""
        with self._lock:
            return sum(not p.closed.is_set() and self._frozen_since(p) is None for p in self._pairs)

    # -- running -------------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        """Start accepting (a daemon thread); returns the proxy."""
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection (FIN); waits up to 5 s in all for the
        proxy's threads to end. Idempotent."""
        self._stopped.set()
        _close(self._listener)  # the shutdown wakes the blocked accept
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.end(rst=False)
        deadline = time.monotonic() + _JOIN
        for thread in [self._acceptor, *(p.thread for p in pairs)]:
            if thread is not None and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- inside --------------------------------------------------------------------------------
    def _frozen_since(self, pair: _Pair) -> float | None:
        """Since when ``pair`` is frozen (by either freeze), or None. Under ``self._lock``."""
        times = [] if pair.frozen_at is None else [pair.frozen_at]
        if self._all_frozen_at is not None:
            times.append(max(self._all_frozen_at, pair.opened_at))
        return min(times, default=None)

    def _frozen(self, pair: _Pair) -> bool:
        return pair.frozen_at is not None or self._all_frozen_at is not None

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)  # the target is down: as if it refused
                continue
            pair = _Pair(client, server)
            pair.thread = threading.Thread(
                target=self._forward, args=(pair,), name="proxy-pair", daemon=True
            )
            with self._lock:
                self._pairs.add(pair)
            try:
                pair.thread.start()
            except RuntimeError:  # no thread to be had: refuse this one, keep accepting
                pair.end(rst=True)
                with self._lock:
                    self._pairs.discard(pair)

    def _armed(self, window: bytes) -> Cut | None:
        """The armed cut whose pattern ``window`` holds, now spent once."""
        with self._lock:
            for cut in self._cuts:
                if cut.times > 0 and cut.pattern in window:
                    cut.times -= 1
                    return cut
        return None

    def _forward(self, pair: _Pair) -> None:
        client, server = pair.client, pair.server
        readable = select.poll()
        readable.register(client, select.POLLIN)
        readable.register(server, select.POLLIN)
        hangup = select.poll()  # while frozen: only whether the client closed its end
        hangup.register(client, _HUNG_UP)
        tail = b""  # the client's last bytes, for a pattern split between two reads
        try:
            while not pair.closed.is_set():
                if self._frozen(pair):
                    # Read nothing, send nothing, close nothing; but once the client closed
                    # its end there is nothing left to hold.
                    if hangup.poll(_TICK * 1000) and not pair.closed.is_set():
                        return
                    continue
                for fd, _ in readable.poll(_TICK * 1000):
                    if self._frozen(pair) or pair.closed.is_set():
                        break
                    source = client if fd == client.fileno() else server
                    data = source.recv(65536)
                    if not data:  # one side closed: close the other (FIN)
                        return
                    if source is client:
                        window = tail + data
                        tail = window[-_TAIL:]
                        if pair.doomed is None:
                            pair.doomed = self._armed(window)
                        server.sendall(data)
                    elif pair.doomed is not None:  # the doomed request's reply begins
                        if pair.end(rst=True):
                            with self._lock:
                                pair.doomed.count += 1
                            pair.doomed.done.set()
                        return
                    else:
                        client.sendall(data)
        except (OSError, ValueError):  # a socket closed under us
            pass
        finally:
            pair.end(rst=False)
            with self._lock:
                self._pairs.discard(pair)
