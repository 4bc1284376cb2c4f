"""The exec warden: a turn's shell command never outlives its step's lease.

A ``shell`` tool call runs its command as a child of the turn worker (``tools._run_shell``,
under coreutils ``timeout``, which dies with the worker). A *frozen* worker (SIGSTOP, a
stalled VM thread) stops refreshing its step's lease (``Keys.step_lease``), and once the
lease lapses the census counts the turn as not live (``turn.lua``: a ``cancelling`` turn
without its lease is stale), but freezing a process does not freeze its children: the command
would run on, hidden. So every command is watched by this process's *warden*: one child
process per worker process (``Warden``, started when a turn worker is ready, or else with
the first command it watches; it dies
with the thread that started it, ``PR_SET_PDEATHSIG``, and when the worker's end of its pipe
closes), which the worker's freeze does not reach. Per command it watches (``ExecWatch``):

* every ``1/8`` lease it reads the lease (its value, the step copy's token, and its remaining
  TTL; the leases of every command then due in one round trip, never retried, that may take
  ``watchdogs.READ_TIMEOUT``) and keeps the local (monotonic) time it lapses, as last read;
* once less than a third of a lease is left (the step watch refreshes it every second of a
  five-second lease), or the lease is gone or held by another copy of the step, it kills the
  command's process tree (SIGKILL to its group, only after the pid is verified by its start
  time, and ``cgroup.kill`` of its cgroup: ``containment.kill_tree_if_ours``) and stops
  watching it. When Redis cannot be read it judges by
  the lapse time it last read, since the server's TTL keeps running;
* it stops watching a command once its tree is gone, or when the worker says it ended.

The worker speaks to its warden over the warden's stdin, one JSON object per line:
``{"watch": [turn_id, token, lease_ms, pid, pid_start, tree]}`` (``tree``: the command's
cgroup, ``containment.Tree.handle``, ``""`` for none) and ``{"drop": [pid, pid_start]}``.
A warden found dead (killed, or the thread that started it ended) is started again with every
command still watched; one that does not take a line at once (frozen, its pipe full) is
killed and replaced, so a command never waits on it.

Run as ``python -m orchestrator.process.execwatch``; the store is the settings'
(``FLEET_REDIS_URL``,
``FLEET_KEY_PREFIX``: the URL never goes on a command line). Imports no Celery. The lease
rule is the job watchdog's (``orchestrator/job/jobwatch.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, BinaryIO

from orchestrator.errors import StoreUnavailable
from orchestrator.process import containment, watchdogs
from orchestrator.process.ownership import is_process, process_start
from orchestrator.storage.sharing import PerStore
from orchestrator.storage.store import Store, translated

#: Named, not ``__name__``: run with ``-m`` this module is ``__main__``.
log = logging.getLogger("orchestrator.process.execwatch")

#: A watched command: its pid and start time (``ownership.process_start``, as text).
Watch = tuple[int, str]

#: Seconds between the warden's beats: a byte on its stdout, from a thread of its own.
BEAT = 0.25
#: Seconds without a beat after which the worker replaces its warden (frozen: SIGSTOP).
SILENCE = 2.0
#: Seconds a new warden has for its first beat (its interpreter's start-up).
START_GRACE = 30.0


#: Per turn id: the step lease's value (the owning copy's token) and remaining TTL in ms.
Lease = tuple[str | None, int]


def _read(store: Store, turn_ids: list[str]) -> dict[str, Lease]:
    """The step leases of ``turn_ids``: one round trip, never retried (the next tick reads
    again). Raises ``StoreUnavailable``."""
    with translated():
        pipe = store.redis.pipeline(transaction=False)
        for tid in turn_ids:
            pipe.get(store.keys.step_lease(tid))
            pipe.pttl(store.keys.step_lease(tid))
        found = pipe.execute()
    return {tid: (found[2 * i], int(found[2 * i + 1])) for i, tid in enumerate(turn_ids)}


class ExecWatch:
    """Watches one command (``pid``, started at ``started``, its tree's cgroup ``tree``) of the
    step copy ``token`` of turn ``turn_id`` (see the module docstring); ``judge`` does one
    pass."""

    def __init__(
        self, turn_id: str, token: str, lease_ms: int, pid: int, started: str, tree: str = ""
    ) -> None:
        self.turn_id = turn_id
        self.token = token
        self.pid = pid
        self.started = started
        self.tree = tree
        self.margin = watchdogs.kill_margin(lease_ms)
        self.interval = watchdogs.poll_interval(lease_ms)
        #: Monotonic seconds at which the lease lapses, as last read.
        self.lapses = time.monotonic() + lease_ms / 1000
        #: Monotonic seconds at which the next pass is due (at once, at first).
        self.due = 0.0

    def judge(self, lease: Lease | None, asked: float) -> bool:
        """One pass, given the lease as read by a request sent at ``asked`` (monotonic; the
        TTL counts from then at the latest) or ``None`` (it could not be read: the lapse time
        last read stands). Returns whether the watch is over (the command is gone or was
        killed)."""
        if not is_process(self.pid, self.started) and not containment.recorded_alive(self.tree):
            return True
        if lease is not None:
            token, ttl_ms = lease
            held = token == self.token and ttl_ms > 0
            self.lapses = asked + ttl_ms / 1000 if held else float("-inf")
        if self.lapses - time.monotonic() >= self.margin:
            return False
        if containment.kill_tree_if_ours(self.pid, self.started, self.tree):
            log.warning(
                "turn %s: its step's lease ran out (worker frozen?): shell command killed (pid %d)",
                self.turn_id,
                self.pid,
                extra={"turn_id": self.turn_id},
            )
        return True


class Watching:
    """The warden's side: the commands it watches, each judged every ``interval`` of its own.
    ``handle`` takes one request (the module docstring's lines, parsed); ``tick`` reads the
    leases of the watches that are due (one round trip) and judges them, and returns the
    seconds until the next is due (``None``: none left)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.watches: dict[Watch, ExecWatch] = {}

    def handle(self, request: dict[str, Any]) -> None:
        """Raises ``ValueError``/``TypeError`` for a request of another shape."""
        if "watch" in request:
            turn_id, token, lease_ms, pid, started, *tree = request["watch"]
            key = (int(pid), str(started))
            self.watches[key] = ExecWatch(
                str(turn_id), str(token), int(lease_ms), *key, str(tree[0]) if tree else ""
            )
        elif "drop" in request:
            pid, started = request["drop"]
            self.watches.pop((int(pid), str(started)), None)
        else:
            raise ValueError(f"not a warden request: {request!r}")

    def tick(self) -> float | None:
        asked = time.monotonic()
        due = [key for key, watch in self.watches.items() if watch.due <= asked]
        leases: dict[str, Lease] = {}
        if due:
            try:
                leases = _read(self.store, sorted({self.watches[k].turn_id for k in due}))
            except StoreUnavailable as exc:  # the TTLs run on in the server: last reads stand
                log.warning("exec warden: cannot read the step leases: %s", exc)
        now = time.monotonic()
        for key in due:
            watch = self.watches[key]
            try:
                over = watch.judge(leases.get(watch.turn_id), asked)
            except Exception as exc:  # contained: one bad record must not end the watch
                log.warning("exec warden: %s", exc, extra={"turn_id": watch.turn_id})
                over = False
            if over:
                del self.watches[key]
            else:
                watch.due = now + watch.interval
        if not self.watches:
            return None
        return max(0.0, min(w.due for w in self.watches.values()) - time.monotonic())


def _beat(beats: BinaryIO) -> None:
    """Write a byte to ``beats`` every ``BEAT`` seconds until the reader is gone (a full pipe,
    its reader frozen, drops beats rather than block)."""
    os.set_blocking(beats.fileno(), False)
    while True:
        try:
            beats.write(b".")
        except BlockingIOError:
            pass
        except (BrokenPipeError, ValueError, OSError):
            return
        time.sleep(BEAT)


def serve(store: Store, requests: Iterable[str], beats: BinaryIO | None = None) -> None:
    """The warden's loop: take the request lines of ``requests`` (read on a thread of their
    own) and poll the watches between them, until ``requests`` ends (the worker closed its end
    or died: its commands die with it). With ``beats``, a thread writes a byte to it every
    ``BEAT`` seconds, by which the worker knows its warden is not frozen."""
    if beats is not None:
        threading.Thread(target=_beat, args=(beats,), name="warden-beat", daemon=True).start()
    inbox: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        try:
            for line in requests:
                inbox.put(line)
        finally:
            inbox.put(None)

    threading.Thread(target=read, name="warden-inbox", daemon=True).start()
    watching = Watching(store)
    wait: float | None = None
    while True:
        try:
            line = inbox.get(timeout=wait)
        except queue.Empty:
            line = ""
        while line is not None:
            if line.strip():
                try:
                    watching.handle(json.loads(line))
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning("exec warden: a bad request line (%s): %.200r", exc, line)
            try:
                line = inbox.get_nowait()
            except queue.Empty:
                break
        if line is None:
            return
        wait = watching.tick()


class Warden:
    """The worker's side: this process's warden for one store (``warden(store)``), started
    by ``start`` (a turn worker, when ready) or else with the first ``watch``, and again
    whenever it is found dead or silent; every method is safe from any thread."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0
        #: Monotonic seconds of the running warden's last beat (or of its start), and
        #: whether it has beaten yet.
        self._heard = 0.0
        self._beaten = False
        #: What the warden must watch now: each watched command's request.
        self._watched: dict[Watch, dict[str, Any]] = {}

    @property
    def pid(self) -> int | None:
        """The warden process's pid, while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _ours(self) -> subprocess.Popen[bytes] | None:
        """The warden this process started (a forked copy of this object holds its parent's),
        running or not."""
        return self._proc if self._owner == os.getpid() else None

    def start(self) -> None:
        """Start the warden now unless it runs (a turn worker starts it when it is ready, so
        its first command does not wait for the warden's start-up). Raises ``OSError``."""
        with self._lock:
            proc = self._ours()
            if proc is not None and proc.poll() is None:
                return
            self._proc = None
            self._start()

    def watch(
        self, turn_id: str, token: str, lease_ms: int, pid: int, tree: str = ""
    ) -> Watch | None:
        """Have command ``pid`` (its tree's cgroup ``tree``, ``containment.Tree.handle``) of
        step copy ``token`` of ``turn_id`` (lease ``lease_ms``) watched. ``None`` when its
        start time cannot be read (it is already gone). Raises ``OSError`` when no warden can
        be started."""
        started = process_start(pid)
        if started is None:
            return None
        key = (pid, repr(started))
        request = {"watch": [turn_id, token, lease_ms, pid, key[1], tree]}
        with self._lock:
            self._watched[key] = request
            self._send(request)
        return key

    def drop(self, key: Watch | None) -> None:
        """Stop watching a command ``watch`` returned (it is over). Never raises."""
        if key is None:
            return
        with self._lock:
            if self._watched.pop(key, None) is None:
                return
            try:  # a warden found dead is started again only for the others
                self._send({"drop": list(key)}, restart=bool(self._watched))
            except OSError as exc:
                log.warning("exec warden not started again: %s", exc)

    def ensure(self) -> None:
        """Start the warden again, with every watched command, if it died (killed, or the
        thread that started it ended) or went ``SILENCE`` seconds without a beat (frozen)
        while commands are watched. Raises ``OSError``."""
        with self._lock:
            proc = self._ours()
            if not self._watched:
                return
            if proc is not None:
                if proc.poll() is None:
                    silent = time.monotonic() - self._heard
                    if silent <= (SILENCE if self._beaten else START_GRACE):
                        return
                    log.warning(
                        "exec warden (pid %d) silent for %.1f s (frozen?): replaced",
                        proc.pid,
                        silent,
                    )
                    _end(proc, kill=True)
                else:
                    log.warning("exec warden (pid %d) died: started again", proc.pid)
            self._proc = None
            self._start()

    def close(self) -> None:
        """End the warden (it exits once its stdin closes) and forget every watch."""
        with self._lock:
            self._watched.clear()
            proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc, kill=False)

    def _send(self, request: dict[str, Any], *, restart: bool = True) -> None:
        line = (json.dumps(request) + "\n").encode()
        proc = self._ours()
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            try:  # a line is shorter than PIPE_BUF: written whole or not at all
                if proc.stdin.write(line) == len(line):
                    return
            except (BlockingIOError, BrokenPipeError, ValueError):
                pass
            log.warning("exec warden (pid %d) did not take a request: replaced", proc.pid)
        if proc is not None:
            _end(proc, kill=True)
        self._proc = None
        if not restart:
            return
        self._start()  # with every watched command, this request's included

    def _start(self) -> None:
        # Requests unbuffered and non-blocking (a write that would wait on the warden fails
        # instead); beats read by a thread of their own.
        proc = watchdogs.spawn(
            self.store,
            "orchestrator.process.execwatch",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)
        self._proc, self._owner = proc, os.getpid()
        self._heard, self._beaten = time.monotonic(), False
        threading.Thread(
            target=self._listen, args=(proc,), name="warden-beats", daemon=True
        ).start()
        lines = b"".join((json.dumps(r) + "\n").encode() for r in self._watched.values())
        if lines:
            try:
                proc.stdin.write(lines)
            except (BlockingIOError, BrokenPipeError) as exc:
                log.warning("exec warden (pid %d) did not take its watches: %s", proc.pid, exc)

    def _listen(self, proc: subprocess.Popen[bytes]) -> None:
        """Note each beat of warden ``proc`` until its stdout ends (it exited)."""
        assert proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            while proc.stdout.read(64):
                if self._proc is proc:
                    self._heard, self._beaten = time.monotonic(), True
        with contextlib.suppress(OSError):
            proc.stdout.close()


def _end(proc: subprocess.Popen[bytes], *, kill: bool) -> None:
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()
    if kill:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


_wardens: PerStore[Warden] = PerStore()


def warden(store: Store) -> Warden:
    """This process's warden for ``store`` (made by the first call)."""
    return _wardens.get(store, Warden)


def main() -> None:
    """Serve the requests of stdin until it closes."""
    store = watchdogs.own_store("execwatch", "turn")
    serve(store, sys.stdin, os.fdopen(sys.stdout.fileno(), "wb", buffering=0, closefd=False))


if __name__ == "__main__":  # pragma: no cover - the turn worker's child process
    main()
