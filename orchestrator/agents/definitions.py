"""Agent definitions: the agents a fleet can run, read from the TOML file ``FLEET_AGENTS_FILE``.

One table per agent::

    [agents.codex]
    preset = "codex"                      # codex | claude | gemini | acp
    upstream = "http://127.0.0.1:8000/v1" # the model server, as the agent's own base URL setting
    api_key_env = "OPENAI_API_KEY"        # the host variable holding the upstream key
    model = "gpt-5.4"                     # optional: the model the agent asks for
    permissions = "ask"                   # ask | allow | deny
    command = ["codex-acp"]               # optional for the three presets (found on PATH)
    env = { RUST_LOG = "warn" }           # optional: added to the agent's environment

An ``acp`` agent needs ``command``; the presets know their binary, how to point it at
``upstream`` and which client capabilities to offer (``orchestrator/agents/presets.py``).
Upstream keys stay on the host: a definition names the variable that holds one
(``api_key_env``), never the key, so nothing secret reaches Redis, events or logs.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from orchestrator.errors import InvalidParams

#: What an agent's name may be: a short word, as it appears in lists and `_meta`.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Preset(StrEnum):
    """Which agent a definition runs (``orchestrator/agents/presets.py`` knows each)."""

    CODEX = "codex"
    CLAUDE = "claude"
    GEMINI = "gemini"
    ACP = "acp"  #: any other agent speaking ACP over stdio; ``command`` is required


class Policy(StrEnum):
    """How an agent's permission requests are answered: by a person (``ask``, within
    ``permission_timeout_seconds``, else ``cancelled``) or by the definition."""

    ASK = "ask"
    ALLOW = "allow"
    DENY = "deny"


class UnknownAgent(InvalidParams):
    """A session asked for an agent no definition names (or the fleet has none)."""

    code = "unknown_agent"

    def __init__(self, name: str, known: list[str]) -> None:
        where = (
            ", ".join(known)
            if known
            else "none (FLEET_AGENTS_FILE is unset or names no agents where this runs)"
        )
        super().__init__(
            f"Unknown agent {name[:80]!r}; the agents of this fleet are: {where}.",
            {"param": "agent", "allowed": known},
        )


class AgentsFileError(InvalidParams):
    """``FLEET_AGENTS_FILE`` cannot be read or does not describe agents; the message names
    the file and what is wrong in it."""

    code = "agents_file_invalid"


class AgentDefinition(BaseModel):
    """One ``[agents.NAME]`` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    preset: Preset
    command: list[str] = Field(default_factory=list)
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(
        default_factory=dict
    )
    upstream: str = ""
    api_key_env: str = ""
    model: str = ""
    permissions: Policy = Policy.ASK
    #: Seconds a person has to answer a permission request (``ask``) before it is cancelled.
    permission_timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    #: Seconds between ``session/cancel`` and the kill of the agent's tree.
    cancel_grace_seconds: float = Field(default=0.5, ge=0, le=60)
    #: Seconds an agent process is kept between two prompts of its session.
    idle_seconds: float = Field(default=300.0, ge=0, le=86_400)
    #: Seconds the agent has to start and answer ``initialize``.
    start_timeout_seconds: float = Field(default=30.0, gt=0, le=600)


@dataclass(frozen=True)
class Catalog:
    """The agents of a fleet by name, and the file they came from (``None``: no file)."""

    agents: dict[str, AgentDefinition]
    source: Path | None = None

    def names(self) -> list[str]:
        """The agents' names, sorted."""
        return sorted(self.agents)

    def get(self, name: str) -> AgentDefinition:
        """The definition named ``name``. Raises ``UnknownAgent``."""
        found = self.agents.get(name)
        if found is None:
            raise UnknownAgent(name, self.names())
        return found


def parse(text: str, source: str = "FLEET_AGENTS_FILE") -> Catalog:
    """The agents described by TOML ``text``. Raises ``AgentsFileError`` naming ``source``
    and the table or field at fault."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AgentsFileError(f"{source} is not valid TOML: {exc}.") from None
    extra = sorted(set(data) - {"agents"})
    if extra:
        raise AgentsFileError(f"{source}: unknown top-level key(s) {extra}; only [agents.NAME].")
    tables = data.get("agents", {})
    if not isinstance(tables, dict):
        raise AgentsFileError(f"{source}: 'agents' must be tables, [agents.NAME].")
    agents: dict[str, AgentDefinition] = {}
    for name, table in tables.items():
        agents[name] = _definition(name, table, source)
    return Catalog(agents)


def _definition(name: str, table: object, source: str) -> AgentDefinition:
    if not NAME_PATTERN.match(name):
        raise AgentsFileError(
            f"{source}: agent name {name[:80]!r} is not a short word (letters, digits, _ . -)."
        )
    if not isinstance(table, dict):
        raise AgentsFileError(f"{source}: [agents.{name}] must be a table.")
    try:
        found = AgentDefinition.model_validate({**table, "name": name})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise AgentsFileError(f"{source}: [agents.{name}]: {problems}.") from None
    if found.preset is Preset.ACP and not found.command:
        raise AgentsFileError(f"{source}: [agents.{name}]: an 'acp' agent needs a command.")
    return found


_cache: dict[tuple[str, float], Catalog] = {}


def load(path: Path | None) -> Catalog:
    """The agents of ``path`` (``FLEET_AGENTS_FILE``; ``None``: no agents), read again when
    the file changes. Raises ``AgentsFileError`` (missing, unreadable or invalid)."""
    if path is None:
        return Catalog({})
    try:
        stamp = path.stat().st_mtime
    except OSError as exc:
        raise AgentsFileError(f"FLEET_AGENTS_FILE {str(path)!r} cannot be read: {exc}.") from None
    key = (str(path), stamp)
    if key not in _cache:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AgentsFileError(
                f"FLEET_AGENTS_FILE {str(path)!r} cannot be read: {exc}."
            ) from None
        found = parse(text, f"FLEET_AGENTS_FILE {str(path)!r}")
        _cache.clear()
        _cache[key] = Catalog(found.agents, path)
    return _cache[key]


def resolve(agents_file: Path | None, default: str, name: str | None) -> str:
    """The agent a new session runs: ``name`` checked against the agents of ``agents_file``
    (``FLEET_AGENTS_FILE``), or ``default`` (``FLEET_AGENT``) when ``name`` is ``None``;
    ``""``: none, the built-in model runs it. Raises ``UnknownAgent``, ``AgentsFileError``."""
    chosen = default if name is None else name
    if not chosen:
        return ""
    load(agents_file).get(chosen)
    return chosen


def agent_for(settings: Any, name: str | None) -> str:
    """``resolve`` with a process's ``FleetSettings`` (``agents_file``, ``agent``): what the
    interfaces call before creating a session. Raises ``UnknownAgent``, ``AgentsFileError``."""
    return resolve(settings.agents_file, settings.agent, name)
