"""docker-compose.yml and the Dockerfile, checked structurally (Docker does not run here).

The compose file must keep Redis durable and healthy before anything else starts, run every
service from one image with a real ``fleet`` command (parsed by the CLI itself, so an unknown
option or a bad value fails here), require its secrets instead of defaulting them, let job
workers scale as hosts of their own, and the Dockerfile must build that image as a non-root
user.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer

from orchestrator.families import names as family_names

yaml = pytest.importorskip("yaml", reason="pyyaml is needed to parse docker-compose.yml")

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HOSTS_PAGE = ROOT / "docs" / "several-hosts.md"

# One worker service per registered family (orchestrator/families).
WORKER_FAMILIES = set(family_names())
EXPECTED_SERVICES = {
    "redis",
    "api",
    "flower",
    *(f"worker-{name}" for name in WORKER_FAMILIES),
    *(f"worker-{name}-control" for name in ("turn", "subagent", "reminder")),
    "sentinel-1",
    "sentinel-2",
    "sentinel-3",
    "redis-replica-1",
    "redis-replica-2",
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
# Recent typer vendors click (``typer._click``): take its exception classes from typer's own.
ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)
#: Secret -> (the compose variable it is read from, the one service that gets it).
SECRETS = {
    "FLEET_API_TOKEN": ("FLEET_API_TOKEN", "api"),
    "FLEET_FLOWER_BASIC_AUTH": ("FLOWER_BASIC_AUTH", "flower"),
}
#: The fleet's Redis: the three Sentinel services, in kombu's form
# (orchestrator/storage/redisconn.py).
SENTINEL_URL = ";".join(f"sentinel://sentinel-{i}:26379" for i in (1, 2, 3))
#: Services reachable from outside the compose network, and their ports.
PUBLISHED = {"api": "8765:8765", "flower": "5555:5555"}


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


def _fleet_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in services.items() if not _is_redis(svc)}


def _is_redis(svc: dict[str, Any]) -> bool:
    """A Redis data node or Sentinel (the redis image), not a fleet service."""
    return str(svc.get("image", "")).startswith("redis:")


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _seconds(duration: str) -> float:
    """A compose duration (``30s``, ``1m30s``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), duration
    return sum(float(n) * units[u] for n, u in parts)


# --------------------------------------------------------------------------- the CLI


def _cli_group() -> Any:
    """The ``fleet`` CLI as (typer's) click sees it: a group of commands."""
    cli = pytest.importorskip("api.cli", reason="api/cli/ is not importable yet")
    app = getattr(cli, "app", None)
    if app is None:
        pytest.skip("api.cli defines no typer app named `app` yet")
    import typer.main

    group = typer.main.get_command(app)
    assert isinstance(getattr(group, "commands", None), dict), "fleet must be a command group"
    return group


def parse_fleet(argv: list[str]) -> Any:
    """Parse ``fleet <argv>`` the way the CLI would, without running it: find the (sub)command,
    then let it parse and convert its arguments. Unknown commands or options, missing values,
    invalid choices and out-of-range numbers raise ``ClickException``."""
    args = list(argv)  # click consumes the list it parses
    command = _cli_group()
    path = ["fleet"]
    while isinstance(getattr(command, "commands", None), dict):
        if not args or args[0] not in command.commands:
            raise UsageError(f"`{' '.join(path)}` has no command {args[:1]}")
        path.append(args.pop(0))
        command = command.commands[path[-1]]
    return command.make_context(" ".join(path), args, resilient_parsing=False)


def test_cli_provides_the_documented_commands() -> None:
    assert set(_cli_group().commands) >= DOCUMENTED_COMMANDS


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--family", "job", "--bogus"],
        ["worker", "--family", "fish"],
        ["worker"],
        ["flower", "--port", "http"],
        ["up", "--hosts", "0"],
        ["sessions", "rm", "x"],
        ["nope"],
    ],
)
def test_the_cli_parser_rejects_bad_command_lines(argv: list[str]) -> None:
    # The check below would prove nothing if the parser accepted anything
    with pytest.raises(ClickException):
        parse_fleet(argv)


def test_every_fleet_command_in_the_compose_file_parses(
    services: dict[str, dict[str, Any]],
) -> None:
    fleet_commands = _fleet_commands(services)
    assert set(fleet_commands) == set(_fleet_services(services)), "one image, fleet commands"
    for name, argv in fleet_commands.items():
        assert argv[1] in DOCUMENTED_COMMANDS, f"{name}: `fleet {argv[1]}` is not documented"
        try:
            ctx = parse_fleet(argv[1:])
        except ClickException as exc:
            pytest.fail(f"{name}: `{' '.join(argv)}` is rejected by the CLI: {exc}")
        if argv[1] == "worker":
            assert ctx.params["family"].value in WORKER_FAMILIES


# --------------------------------------------------------------------------- services


def test_all_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= EXPECTED_SERVICES


def test_redis_is_durable_and_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    redis = services["redis"]
    command = _command(redis)
    assert command[0] == "redis-server"
    assert _option(command, "--appendonly") == "yes"
    assert _option(command, "--appendfsync") == "always"
    test = redis["healthcheck"]["test"]
    assert "redis-cli" in test and "ping" in test
    assert any(str(v).endswith(":/data") for v in redis.get("volumes", []))


def test_redis_data_lives_in_a_named_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    [mount] = [v for v in services["redis"]["volumes"] if str(v).endswith(":/data")]
    assert mount.split(":")[0] in (compose.get("volumes") or {})


def test_every_other_service_waits_for_healthy_redis(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in _fleet_services(services).items():
        depends = svc.get("depends_on")
        assert isinstance(depends, dict), f"{name}: depends_on must use the long form"
        assert depends.get("redis", {}).get("condition") == "service_healthy", name


def test_fleet_services_share_one_image_built_here_and_the_redis_url(
    services: dict[str, dict[str, Any]],
) -> None:
    fleet = _fleet_services(services)
    assert len({svc.get("image") for svc in fleet.values()}) == 1
    assert None not in {svc.get("image") for svc in fleet.values()}
    for name, svc in fleet.items():
        build = svc.get("build")
        context = build.get("context") if isinstance(build, dict) else build
        assert context in (".", "./"), f"{name}: built from the Dockerfile here"
        assert svc.get("environment", {}).get("FLEET_REDIS_URL") == SENTINEL_URL, name
    commands = [tuple(_command(svc)) for svc in fleet.values()]
    assert len(set(commands)) == len(commands), "several commands, one per service"


def _sentinel_config(svc: dict[str, Any]) -> list[str]:
    """The lines a Sentinel service writes into its configuration file."""
    script = _command(svc)
    assert script[:2] == ["sh", "-c"], "the Sentinel writes its configuration, then runs"
    text = " ".join(script[2:])
    assert "exec redis-server /data/sentinel.conf --sentinel" in text
    assert text.startswith("test -f /data/sentinel.conf ||"), "written once, kept on restart"
    tokens = shlex.split(text)
    start = tokens.index("printf") + 2  # after printf and its format
    return tokens[start : tokens.index(">")]


def test_three_sentinels_watch_the_primary_the_fleet_names(
    services: dict[str, dict[str, Any]],
) -> None:
    from orchestrator.storage.redisconn import parse_sentinel_url

    sentinels = {n: s for n, s in services.items() if n.startswith("sentinel-")}
    assert set(sentinels) == {"sentinel-1", "sentinel-2", "sentinel-3"}
    address = parse_sentinel_url(SENTINEL_URL)
    assert sorted(h for h, _ in address.sentinels) == sorted(sentinels)
    env = services["api"]["environment"]
    master = env["FLEET_REDIS_SENTINEL_MASTER"]
    volumes = set()
    for name, svc in sentinels.items():
        # Always on: without the ha profile they name the one primary.
        assert "profiles" not in svc, name
        config = _sentinel_config(svc)
        assert "port 26379" in config
        assert f"sentinel monitor {master} redis 6379 2" in config, "quorum 2 of 3"
        assert any(
            line.startswith(f"sentinel down-after-milliseconds {master} ") for line in config
        )
        assert "sentinel resolve-hostnames yes" in config
        assert "sentinel announce-hostnames yes" in config
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "26379" in svc["healthcheck"]["test"]
        [mount] = svc["volumes"]
        volumes.add(mount.split(":")[0])
    assert len(volumes) == 3, "each Sentinel keeps its own state"


def test_the_ha_profile_adds_two_durable_replicas_of_the_primary(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    profiled = {n: s for n, s in services.items() if s.get("profiles")}
    assert set(profiled) == {"redis-replica-1", "redis-replica-2"}
    for name, svc in profiled.items():
        assert svc["profiles"] == ["ha"]
        command = _command(svc)
        assert command[0] == "redis-server"
        assert _option(command, "--appendonly") == "yes"
        assert _option(command, "--appendfsync") == "always"
        assert command[command.index("--replicaof") + 1 : command.index("--replicaof") + 3] == [
            "redis",
            "6379",
        ]
        assert _option(command, "--replica-announce-ip") == name
        [mount] = svc["volumes"]
        assert mount.endswith(":/data") and mount.split(":")[0] in compose["volumes"]
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert _option(_command(services["redis"]), "--replica-announce-ip") == "redis"


def test_fleet_services_wait_for_the_sentinels_and_may_require_a_replica_ack(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, svc in _fleet_services(services).items():
        for sentinel in ("sentinel-1", "sentinel-2", "sentinel-3"):
            assert svc["depends_on"][sentinel]["condition"] == "service_healthy", name
        ack = svc["environment"]["FLEET_REDIS_MIN_REPLICAS_ACK"]
        assert ack == "${FLEET_REDIS_MIN_REPLICAS_ACK:-0}", "0 unless the ha profile asks"


def test_every_service_restarts_by_itself(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        assert svc.get("restart") in {"always", "unless-stopped"}, name


def test_the_api_and_flower_have_healthchecks_on_their_own_ports(
    services: dict[str, dict[str, Any]],
) -> None:
    checks = {"api": "/health", "flower": "/healthcheck"}
    for name, path in checks.items():
        svc = services[name]
        port = _option(_command(svc), "--port")
        health = svc["healthcheck"]
        test = health["test"]
        assert test[0] == "CMD", f"{name}: exec form (the image has no shell tools to rely on)"
        assert test[1] == "python", f"{name}: the image has Python, not curl"
        assert f"http://127.0.0.1:{port}{path}'" in " ".join(test), name
        for key in ("interval", "timeout"):
            assert _seconds(health[key]) > 0, (name, key)
        assert int(health["retries"]) >= 1, name


def test_healthchecks_compile() -> None:
    # The inline Python of each healthcheck is at least valid Python.
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, svc in services.items():
        test = (svc.get("healthcheck") or {}).get("test", [])
        if test[:2] == ["CMD", "python"]:
            compile(_option(test, "-c"), f"<{name} healthcheck>", "exec")


def test_worker_services_cover_every_family(services: dict[str, dict[str, Any]]) -> None:
    families = {}
    control = {}
    for name, command in _fleet_commands(services).items():
        if command[1] == "worker":
            (control if "--control" in command else families)[_option(command, "--family")] = name
    assert set(families) == WORKER_FAMILIES
    assert families["job"] == "worker-job"
    # The reminder poller runs inside the reminder worker (no service of its own)
    assert families["reminder"] == "worker-reminder"
    # Every family whose stops need not run on the owning host has a stop worker of its own,
    # beside the workers whose threads run its work (the job stops run on the job's host)
    assert control == {name: f"worker-{name}-control" for name in ("turn", "subagent", "reminder")}


def test_job_workers_scale_as_hosts_of_their_own(services: dict[str, dict[str, Any]]) -> None:
    job = services["worker-job"]
    # Every replica takes its host name from its container (unique per container), so none
    # may pin a host name, a container name or a published port, which --scale would share
    for key in ("container_name", "hostname", "ports"):
        assert key not in job, key
    assert "FLEET_HOSTNAME" not in job.get("environment", {})
    assert "--host" not in _command(job)
    # It reaps the job processes it starts and has time to terminate them on stop (SIGTERM,
    # then SIGKILL after the kill grace, 2 s by default)
    assert job.get("init") is True
    assert _seconds(job["stop_grace_period"]) >= 10


def test_only_the_api_and_flower_are_published(services: dict[str, dict[str, Any]]) -> None:
    published = {name: svc["ports"] for name, svc in services.items() if svc.get("ports")}
    assert published == {name: [port] for name, port in PUBLISHED.items()}


def test_secrets_are_required_not_defaulted(services: dict[str, dict[str, Any]]) -> None:
    flower = services["flower"]
    assert _command(flower)[:2] == ["fleet", "flower"]
    for secret, (variable, owner) in SECRETS.items():
        value = services[owner]["environment"][secret]
        assert value.startswith("${" + variable + ":?"), (secret, value)
        # No other service gets the secret
        for name, svc in services.items():
            if name != owner:
                assert secret not in (svc.get("environment") or {}), (secret, name)
    # Nowhere in the file is a secret given a default (${VAR:-x} / ${VAR-x}) or a literal
    text = COMPOSE.read_text()
    for secret, (variable, _) in SECRETS.items():
        for name in {secret, variable}:
            assert not re.search(r"\$\{" + name + r":?-", text), name
            assert not re.search(rf"^\s*{name}\s*[:=]\s*[^$\s]", text, re.M), name


def test_flower_runs_with_auth_beyond_loopback(services: dict[str, dict[str, Any]]) -> None:
    command = _command(services["flower"])
    assert _option(command, "--address") == "0.0.0.0"
    assert services["flower"]["environment"]["FLEET_FLOWER_BASIC_AUTH"]


# --------------------------------------------------------------------------- the image


def _dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def test_dockerfile_installs_the_project() -> None:
    lines = _dockerfile()
    assert lines[0].startswith("FROM python:3.1")
    copied = {line.split()[1].rstrip("/") for line in lines if line.startswith("COPY ")}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "pyproject.toml" in copied
    for pattern in packages:
        assert pattern.rstrip("*") in copied, f"the image lacks the {pattern} packages"
    runs = " ".join(line for line in lines if line.startswith("RUN "))
    assert re.search(r"pip install (--\S+ )*\.(\s|$)", runs), "the project is pip-installed"
    # `fleet` is the console script every service runs
    assert pyproject["project"]["scripts"]["fleet"] == "api.cli:main"


def test_dockerfile_runs_as_non_root() -> None:
    lines = _dockerfile()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0", "0:0"}
    assert lines.index(f"USER {users[-1]}") > max(
        i for i, line in enumerate(lines) if line.startswith("RUN ")
    ), "USER comes after every RUN"
    assert "useradd" in " ".join(lines)


def test_the_build_context_leaves_local_state_out() -> None:
    ignored = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    assert {".venv", ".fleet", ".git", "**/__pycache__"} <= ignored


def test_the_docs_document_docker_compose() -> None:
    text = HOSTS_PAGE.read_text()
    assert "docker compose up" in text
    for needle in (
        "FLEET_API_TOKEN",
        "FLOWER_BASIC_AUTH",
        "--scale worker-job=",
        "docker compose --profile ha up",
        "FLEET_REDIS_MIN_REPLICAS_ACK",
    ):
        assert needle in text, needle
