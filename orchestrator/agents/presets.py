"""What the fleet knows of each agent it can run: its command, how to point it at its model
server, where it keeps its state, and which client capabilities to offer it.

- ``codex`` (npm ``@zed-industries/codex-acp``): configured by ``$CODEX_HOME/config.toml``:
  ``model_provider`` names a provider of our own (``"openai"`` would ask for a login) whose
  ``base_url`` is the upstream (Codex posts ``{base_url}/responses``), ``wire_api =
  "responses"`` and ``env_key`` naming the variable that holds the key. Its sandbox needs
  ``bwrap``. It never uses the client's ``fs/*`` or ``terminal/*``.
- ``claude`` (npm ``@zed-industries/claude-code-acp``): ``ANTHROPIC_BASE_URL``,
  ``ANTHROPIC_API_KEY``, ``CLAUDE_CONFIG_DIR``. It reads and writes files through the client
  when offered ``fs``; without ``terminal`` it runs its shell itself (inside the agent's
  contained tree).
- ``gemini`` (npm ``@google/gemini-cli``, ``gemini --acp``): ``GOOGLE_GEMINI_BASE_URL`` (gateway
  auth), ``GEMINI_API_KEY``, its state under ``$HOME/.gemini``.
- ``acp``: any agent speaking ACP over stdio; its definition gives the command and the
  environment.

Every agent gets a home of its own (``home``): its configuration and history live there,
not in the host user's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agents.definitions import AgentDefinition, Preset

#: The variable the fleet puts an agent's upstream key in (Codex reads the one its
#: configuration names).
KEY_ENV = "FLEET_AGENT_API_KEY"
#: The key handed to an agent whose definition names none (a local model server takes any).
NO_KEY = "none"
#: The model Codex is asked for when the definition names none (one Codex knows, so it does
#: not warn in every turn).
CODEX_MODEL = "gpt-5.4"


@dataclass(frozen=True)
class PresetSpec:
    """One preset: ``command`` (argv), the client capabilities it is offered (``fs``: read
    and write text files through the fleet), the binaries it needs besides its own
    (``needs``), and ``prepare``: (definition, home, upstream key) -> the environment
    variables that point it at its upstream and its home (files it reads are written into
    ``home``)."""

    command: list[str]
    fs: bool
    prepare: Callable[[AgentDefinition, Path, str], dict[str, str]]
    needs: tuple[str, ...] = ()


def _codex(defn: AgentDefinition, home: Path, key: str) -> dict[str, str]:
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    lines = [
        f"model = {json.dumps(defn.model or CODEX_MODEL)}",
        'model_provider = "fleet"',
        "",
        "[model_providers.fleet]",
        'name = "fleet"',
        f"base_url = {json.dumps(defn.upstream)}",
        'wire_api = "responses"',
        f"env_key = {json.dumps(KEY_ENV)}",
    ]
    # Before the provider table: the session's cwd is its workspace (in a directory it does
    # not trust Codex starts read-only), and no update check where there may be no network.
    lines[2:2] = ['sandbox_mode = "workspace-write"', "check_for_update_on_startup = false"]
    (codex_home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"CODEX_HOME": str(codex_home), KEY_ENV: key}


def _claude(defn: AgentDefinition, home: Path, key: str) -> dict[str, str]:
    config = home / "claude"
    config.mkdir(parents=True, exist_ok=True)
    env = {
        "CLAUDE_CONFIG_DIR": str(config),
        "ANTHROPIC_API_KEY": key,
        # No calls home (telemetry, update checks, error reports) from a fleet's hosts.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    if defn.upstream:
        env["ANTHROPIC_BASE_URL"] = defn.upstream
    if defn.model:
        env["ANTHROPIC_MODEL"] = defn.model
    return env


def _gemini(defn: AgentDefinition, home: Path, key: str) -> dict[str, str]:
    # GEMINI_CLI_NO_RELAUNCH: it would re-execute itself with a larger heap, a second node
    # process in the tree.
    env = {"GEMINI_API_KEY": key, "GEMINI_CLI_NO_RELAUNCH": "true"}
    if defn.upstream:
        env["GOOGLE_GEMINI_BASE_URL"] = defn.upstream
    if defn.model:
        env["GEMINI_MODEL"] = defn.model
    return env


def _plain(defn: AgentDefinition, home: Path, key: str) -> dict[str, str]:
    return {KEY_ENV: key} if key != NO_KEY else {}


_PRESETS = {
    Preset.CODEX: PresetSpec(["codex-acp"], fs=False, prepare=_codex, needs=("bwrap",)),
    Preset.CLAUDE: PresetSpec(["claude-code-acp"], fs=True, prepare=_claude),
    Preset.GEMINI: PresetSpec(["gemini", "--acp"], fs=True, prepare=_gemini),
    Preset.ACP: PresetSpec([], fs=True, prepare=_plain),
}


def preset_of(preset: Preset) -> PresetSpec:
    """The ``PresetSpec`` of ``preset``."""
    return _PRESETS[preset]


def _under_tmp(home: Path) -> bool:
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    real = Path(os.path.realpath(home))
    return real == tmp or tmp in real.parents


def command_of(defn: AgentDefinition) -> list[str]:
    """The command that starts ``defn``'s agent: its ``command``, else its preset's."""
    return list(defn.command) or list(preset_of(defn.preset).command)


def environment(defn: AgentDefinition, home: Path, host_env: dict[str, str]) -> dict[str, str]:
    """The environment an agent runs in: the host's ``PATH`` and locale, ``HOME`` set to
    ``home`` (created), what its preset sets to point it at ``defn.upstream`` with the key
    read from ``host_env[defn.api_key_env]``, then ``defn.env``. Nothing else of the host's
    environment (its secrets among it) reaches the agent."""
    home.mkdir(parents=True, exist_ok=True)
    key = host_env.get(defn.api_key_env, "") if defn.api_key_env else ""
    kept = ("PATH", "LANG", "LC_ALL", "TZ", "TERM", "USER", "LOGNAME", "SHELL")
    env: dict[str, str] = {name: host_env[name] for name in kept if name in host_env}
    env["HOME"] = str(home)
    env.update(preset_of(defn.preset).prepare(defn, home, key or NO_KEY))
    env.update(defn.env)
    return env


def missing(defn: AgentDefinition, path: str | None, home: Path | None = None) -> list[str]:
    """What the host lacks to run ``defn`` with its home in ``home``: its command's binary,
    the binaries its preset needs, a home its preset refuses, each as a phrase naming it
    (empty: nothing). ``path`` is the ``PATH`` searched."""
    argv = command_of(defn)
    gone = []
    if not argv or shutil.which(argv[0], path=path) is None:
        name = argv[0] if argv else "(no command)"
        where = "does not exist or is not executable" if os.path.isabs(name) else "not on PATH"
        gone.append(f"{name} not found ({where})")
    if home is not None and defn.preset is Preset.CODEX and _under_tmp(home):
        gone.append(
            f"the agent's home {home} lies under the temporary directory "
            f"{tempfile.gettempdir()}, where Codex's sandbox will not run commands: set "
            "FLEET_STATE_DIR to a directory outside it"
        )
    for binary in preset_of(defn.preset).needs:
        if shutil.which(binary, path=path) is None:
            gone.append(f"{binary} not found on PATH (the {defn.preset} agent's sandbox needs it)")
    return gone
