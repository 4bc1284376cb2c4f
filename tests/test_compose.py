"""docker-compose.yml stays consistent with the CLI and keeps Redis durable and healthy first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is needed to parse docker-compose.yml")

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

EXPECTED_SERVICES = {
    "redis",
    "api",
    "worker-turn",
    "worker-job",
    "worker-subagent",
    "worker-reminder",
    "flower",
}
# The commands the CLI documents; the compose file may only use these.
DOCUMENTED_COMMANDS = {
    "up",
    "worker",
    "api",
    "demo",
    "sessions",
    "archive",
    "unarchive",
    "acp",
    "flower",
}
WORKER_FAMILIES = {"turn", "job", "subagent", "reminder"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result = compose["services"]
    assert isinstance(result, dict)
    return result


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    if isinstance(command, str):
        return command.split()
    return [str(part) for part in command]


def _fleet_commands(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {name: _command(svc) for name, svc in services.items() if _command(svc)[:1] == ["fleet"]}


def test_all_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= EXPECTED_SERVICES


def test_redis_is_durable_and_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    redis = services["redis"]
    command = _command(redis)
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    test = redis["healthcheck"]["test"]
    assert "redis-cli" in test and "ping" in test
    assert any(str(v).endswith(":/data") for v in redis.get("volumes", []))


def test_every_other_service_waits_for_healthy_redis(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in services.items():
        if name == "redis":
            continue
        depends = svc.get("depends_on")
        assert isinstance(depends, dict), f"{name}: depends_on must use the long form"
        assert depends.get("redis", {}).get("condition") == "service_healthy", name


def test_fleet_services_share_image_and_redis_url(services: dict[str, dict[str, Any]]) -> None:
    images = {svc.get("image") for name, svc in services.items() if name != "redis"}
    assert len(images) == 1 and None not in images
    for name, svc in services.items():
        if name == "redis":
            continue
        env = svc.get("environment", {})
        assert env.get("FLEET_REDIS_URL") == "redis://redis:6379/0", name


def test_secrets_are_required_not_defaulted(services: dict[str, dict[str, Any]]) -> None:
    assert services["api"]["environment"]["FLEET_API_TOKEN"].startswith("${FLEET_API_TOKEN:?")
    flower = services["flower"]
    assert _command(flower)[:2] == ["fleet", "flower"]
    assert flower["environment"]["FLEET_FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")


def test_worker_services_cover_every_family(services: dict[str, dict[str, Any]]) -> None:
    families = set()
    for command in _fleet_commands(services).values():
        if command[1] == "worker":
            families.add(command[command.index("--family") + 1])
    assert families == WORKER_FAMILIES


def test_dockerfile_runs_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    assert "FROM python:3.11-slim" in text
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}


def _cli_commands() -> dict[str, Any]:
    """Return the CLI's commands by name, as click sees them."""
    cli = pytest.importorskip("api.cli", reason="api/cli.py is not importable yet")
    app = getattr(cli, "app", None)
    if app is None:
        pytest.skip("api.cli defines no typer app named `app` yet")
    import typer.main

    group = typer.main.get_command(app)
    commands = getattr(group, "commands", None)
    assert isinstance(commands, dict), "the fleet CLI must be a group of commands"
    return commands


def test_cli_provides_the_documented_commands() -> None:
    assert set(_cli_commands()) >= DOCUMENTED_COMMANDS


def test_fleet_commands_exist_in_the_cli(services: dict[str, dict[str, Any]]) -> None:
    commands = _cli_commands()
    fleet_commands = _fleet_commands(services)
    assert fleet_commands, "no service runs a `fleet ...` command"
    for name, argv in fleet_commands.items():
        sub, args = argv[1], argv[2:]
        assert sub in DOCUMENTED_COMMANDS, f"{name}: `fleet {sub}` is not a documented command"
        assert sub in commands, f"{name}: the CLI has no `{sub}` command"
        # Parse (and type-convert) the arguments the way the CLI would, without running it:
        # unknown options, missing values and invalid choices raise here.
        try:
            commands[sub].make_context(sub, list(args))
        except Exception as exc:  # the CLI's usage errors
            pytest.fail(f"{name}: `fleet {sub} {' '.join(args)}` is rejected by the CLI: {exc}")
