"""``fleet api`` as a real process for tests that need a real server: a real WebSocket
handshake, a browser, or the process's own log output (import as ``from tests.api_process
import api_process``)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import http_ok, wait_until_up


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class ApiProcess:
    """A running ``fleet api``: its base URL, port and the file its stdout and stderr go to."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (uvicorn's graceful shutdown), SIGKILL after 10 s; idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


#: How the API can be started: ``fleet api``, or uvicorn on the app factory with uvicorn's own
#: logging configuration (as ``tests/console`` and ``bench/`` do).
COMMANDS = {
    "fleet api": ["-m", "api.cli", "api", "--host", "127.0.0.1", "--port"],
    "uvicorn": [
        "-m",
        "uvicorn",
        "api.rest:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--log-level",
        "info",
        "--port",
    ],
}


@contextlib.contextmanager
def api_process(
    log_path: Path, command: str = "fleet api", args: Sequence[str] = (), **env: str
) -> Iterator[ApiProcess]:
    """Start the API (``command``, a key of ``COMMANDS``, ``args`` after it) on a free loopback
    port with this run's Redis and key prefix (conftest's environment), no token unless ``env``
    sets one, and ``env`` applied; wait for ``/health``; stop it (SIGTERM, then SIGKILL) when
    the block ends (the wait fails at once if it exits). Its stdout and stderr go to
    ``log_path``."""
    port = free_port()
    full = dict(os.environ)
    full.pop("FLEET_API_TOKEN", None)
    full.update(env)
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *COMMANDS[command], str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full,
        )
    server = ApiProcess(proc, port, log_path)
    try:
        wait_until_up(lambda: http_ok(f"{server.base}/health"), proc, command, server.log)
        yield server
    finally:
        server.stop()
