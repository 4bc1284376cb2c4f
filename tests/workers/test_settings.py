"""A worker's settings are read once at its entry point and passed down: the Celery app is built
from them by one factory, the runtime takes them from the entry point (not from the
environment), and a missing Redis URL is the documented error, never a default Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import workers.runtime
from orchestrator.settings import FleetSettings, MissingRedisUrl
from workers.app import create_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    """Leave the process's worker runtime as the test found it."""
    saved = (workers.runtime._installed, workers.runtime._runtime)
    yield
    workers.runtime._installed, workers.runtime._runtime = saved


def test_the_app_factory_refuses_settings_without_a_redis_url() -> None:
    with pytest.raises(MissingRedisUrl, match="FLEET_REDIS_URL is not set"):
        create_app(FleetSettings(redis_url=None))
    with pytest.raises(MissingRedisUrl, match="must start with redis://"):
        create_app(FleetSettings(redis_url="http://127.0.0.1:6379"))


def test_each_app_carries_its_own_settings(redis_url: str) -> None:
    a = create_app(FleetSettings(redis_url=redis_url, key_prefix="a:"))
    b = create_app(FleetSettings(redis_url="redis://127.0.0.1:1/0", key_prefix="b:"))
    assert a.conf.broker_url == redis_url
    assert b.conf.broker_url == "redis://127.0.0.1:1/0"
    assert a.conf.broker_transport_options["global_keyprefix"] == "a:celery:"
    assert b.conf.broker_transport_options["global_keyprefix"] == "b:celery:"


def test_the_runtime_is_built_from_the_installed_settings_not_the_environment(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, fresh_runtime: None
) -> None:
    monkeypatch.setenv("FLEET_HOSTNAME", "from-the-environment")
    settings = FleetSettings(redis_url=redis_url, key_prefix="installed:", hostname="h1")
    workers.runtime.install(settings, create_app(settings))
    rt = workers.runtime.get_runtime()
    try:
        assert rt.settings is settings
        assert rt.host == "h1"
        assert rt.store.keys.prefix == "installed:"
        assert workers.runtime.installed_settings() is settings
    finally:
        rt.store.close()


def test_a_process_with_nothing_installed_has_no_runtime(fresh_runtime: None) -> None:
    workers.runtime._installed = workers.runtime._runtime = None
    with pytest.raises(RuntimeError, match="fleet worker"):
        workers.runtime.get_runtime()


def _without_fleet_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python argv...`` from the project root, its output captured."""
    return subprocess.run(
        [sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_celery_dash_a_refuses_to_start_without_a_redis_url() -> None:
    # celery's own command line, as a deployment would run it, with no FLEET_REDIS_URL
    proc = _run(["-m", "celery", "-A", "workers.main", "inspect", "ping"], _without_fleet_env())
    assert proc.returncode != 0
    assert "FLEET_REDIS_URL is not set" in proc.stdout + proc.stderr


def test_celery_dash_a_finds_the_app_built_from_the_environment(
    redis_url: str, key_prefix: str
) -> None:
    env = dict(_without_fleet_env(), FLEET_REDIS_URL=redis_url, FLEET_KEY_PREFIX=key_prefix)
    code = (
        "import workers.main as m, workers.runtime as r;"
        "print(m.app.conf.broker_url, r.installed_settings().key_prefix)"
    )
    proc = _run(["-c", code], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [redis_url, key_prefix]


@pytest.mark.parametrize(
    "command", [["worker", "--family", "turn"], ["api"], ["beat"]], ids=lambda c: c[0]
)
def test_a_service_command_refuses_to_start_without_a_redis_url_with_exit_2(
    command: list[str],
) -> None:
    proc = _run(["-m", "api.cli", *command], _without_fleet_env())
    assert proc.returncode == 2, proc.stderr  # a refusal, as docs/cli.md's exit statuses say
    assert "FLEET_REDIS_URL is not set" in proc.stderr
