"""A TCP proxy of the tests' own, for faults that do not announce themselves: every connection
open through it can be frozen at once (nothing more is forwarded either way, and nothing is
closed or reset: what a peer that vanished, a hung host or a NAT that dropped the flow looks
like), while connections opened afterwards are forwarded as usual.

Threads and sockets only: one thread accepts, one thread per connection forwards both ways.
Used by the fault tests (``tests/faults/test_silent_connections.py``) and the fault soak
(``bench/soak``)::

    with FreezingProxy(("127.0.0.1", redis_port)) as proxy:
        url = proxy.url  # redis://127.0.0.1:<proxy port>/0
        ...
        frozen = proxy.freeze()  # the connections open now go silent
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from types import TracebackType

#: Seconds a forwarding thread waits for data before it looks at its connection's state again.
_TICK = 0.1
#: poll events of a peer that closed its end, even with data still unread (Linux); 0 elsewhere.
_HUNG_UP = getattr(select, "POLLRDHUP", 0)


class _Pair:
    """One proxied connection: the client's socket and the one to the target."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.frozen = False
        #: When it was frozen (``time.monotonic()``).
        self.frozen_at = 0.0
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.close()


class FreezingProxy:
    """Listens on 127.0.0.1 (a free port) and forwards each connection to ``target``
    (``(host, port)``). ``freeze`` silences every connection open now; ``close`` ends
    everything. A context manager (``start`` on enter, ``close`` on exit)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``: the target Redis through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FreezingProxy:
        self._acceptor.start()
        return self

    def freeze(self) -> int:
        """Stop forwarding on every connection open now, for good: bytes already sent to the
        proxy are neither forwarded nor answered, and neither side is closed or reset.
        Connections opened later are forwarded. Returns how many were frozen."""
        now = time.monotonic()
        with self._lock:
            live = [p for p in self._pairs if not p.closed.is_set() and not p.frozen]
            for pair in live:
                pair.frozen, pair.frozen_at = True, now
        return len(live)

    def close_frozen(self, older_than: float = 0.0) -> int:
        """Close (FIN, both ways) every connection frozen at least ``older_than`` seconds
        ago: what a peer's kernel does once it gives up on them. Returns how many."""
        now = time.monotonic()
        with self._lock:
            frozen = [p for p in self._pairs if p.frozen and now - p.frozen_at >= older_than]
        for pair in frozen:
            pair.close()
        return len(frozen)

    def live(self) -> int:
        """Connections open and forwarding."""
        with self._lock:
            return sum(1 for p in self._pairs if not p.frozen and not p.closed.is_set())

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.close()

    def __enter__(self) -> FreezingProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()  # the target is down: as if it refused
                continue
            upstream.settimeout(None)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.add(pair)
            try:
                threading.Thread(
                    target=self._forward, args=(pair,), name="proxy-pair", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had: refuse this one, keep accepting
                pair.close()
                with self._lock:
                    self._pairs.discard(pair)

    def _forward(self, pair: _Pair) -> None:
        # poll, not select: a process holding many frozen connections has descriptors past
        # select's limit (1024), and select then fails on every new connection.
        ends = {
            pair.client.fileno(): (pair.client, pair.upstream),
            pair.upstream.fileno(): (pair.upstream, pair.client),
        }
        readable = select.poll()
        for fd in ends:
            readable.register(fd, select.POLLIN)
        hangup = select.poll()
        hangup.register(pair.client, _HUNG_UP)
        try:
            while not pair.closed.is_set():
                if pair.frozen:
                    # Read nothing, send nothing, close nothing; but once the client closed
                    # its end (it gave up on the silence) there is nothing left to hold.
                    if _HUNG_UP and hangup.poll(0):
                        return
                    pair.closed.wait(_TICK)
                    continue
                for fd, _ in readable.poll(_TICK * 1000):
                    if pair.frozen:
                        break
                    source, target = ends[fd]
                    data = source.recv(65536)
                    if not data:  # one side closed: close the other (FIN)
                        return
                    target.sendall(data)
        except (OSError, ValueError):  # a socket closed under us
            pass
        finally:
            pair.close()
            with self._lock:
                self._pairs.discard(pair)
