"""How to point each real agent at a model server offline, with its own home: the knowledge the
fleet's agent presets copy, as one pure function, ``agent_env``.

Facts, measured with the pinned versions (tests/agents/install.py) against
tests/agents/modelservers.py:

- **Codex** (``codex-acp``, npm ``@zed-industries/codex-acp`` 0.16.0, a native binary). Its
  whole configuration can go on the command line as ``-c key=TOML`` overrides, so no
  ``config.toml`` needs writing: ``model_provider`` must be an id other than ``"openai"``
  (that one demands a login), ``model_providers.<id>.base_url`` is the prefix it posts
  ``{base_url}/responses`` to, ``wire_api = "responses"`` (``"chat"`` is refused),
  ``env_key`` names the variable holding the API key. ``model = "gpt-5.4"``: a model name
  Codex does not know puts a warning into every turn. ``CODEX_HOME`` must exist and lie outside
  ``TMPDIR`` (its sandbox, ``bwrap``, refuses a home under the temp dir). It never asks the
  client for ``fs/*`` or ``terminal/*``; it runs its own shell, sandboxed by ``bwrap``.
- **Claude Code** (``claude-code-acp``, npm ``@zed-industries/claude-code-acp`` 0.16.2, which
  starts the ``claude`` CLI of ``@anthropic-ai/claude-agent-sdk``): ``ANTHROPIC_BASE_URL``
  (without ``/v1``), ``ANTHROPIC_API_KEY`` (any value for a local server),
  ``CLAUDE_CONFIG_DIR`` for its settings and history. The ``DISABLE_*``/
  ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` variables keep it from calling home
  (telemetry, update checks) where there is no internet.
- **Gemini CLI** (``gemini --acp``, npm ``@google/gemini-cli`` 0.61.0):
  ``GOOGLE_GEMINI_BASE_URL`` (switches its auth to gateway mode) and ``GEMINI_API_KEY``; it
  keeps settings and sessions under ``$HOME/.gemini``, so ``HOME`` is its home.
  ``GEMINI_CLI_NO_RELAUNCH`` stops it re-executing itself with a bigger heap (a second node
  process in the tree).

``home`` is a directory the caller has created (``prepare_home`` does), one per agent process
or session; every agent rewrites files there.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The agents this module knows, by the name of their binary.
AGENTS = ("codex-acp", "claude-code-acp", "gemini")
#: The variable every preset puts the (placeholder) API key in.
KEY_VAR = "FLEET_LAB_API_KEY"
#: The model Codex is told to use (one it knows, or every turn carries a warning).
CODEX_MODEL = "gpt-5.4"
#: Variables kept from the caller's environment (the ACP SDK keeps the same few by default).
INHERITED = ("PATH", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SHELL")


class UnknownAgent(ValueError):
    """Raised when ``agent_env`` is asked for an agent it has no preset for."""


def _codex_settings(base_url: str) -> dict[str, str]:
    """Codex's settings for ``base_url``: dotted key -> TOML value."""
    return {
        "model": f'"{CODEX_MODEL}"',
        "model_provider": '"fleetlab"',
        "model_providers.fleetlab.name": '"fleet lab"',
        "model_providers.fleetlab.base_url": f'"{base_url.rstrip("/")}/v1"',
        "model_providers.fleetlab.wire_api": '"responses"',
        "model_providers.fleetlab.env_key": f'"{KEY_VAR}"',
        "check_for_update_on_startup": "false",
    }


def codex_config_toml(base_url: str) -> str:
    """The same settings as ``agent_env`` gives Codex on its command line, as the text of a
    ``$CODEX_HOME/config.toml``, for a caller that prefers a file. Pure."""
    top, table = [], []
    for key, value in _codex_settings(base_url).items():
        if key.startswith("model_providers.fleetlab."):
            table.append(f"{key.rsplit('.', 1)[1]} = {value}")
        else:
            top.append(f"{key} = {value}")
    return "\n".join([*top, "", "[model_providers.fleetlab]", *table, ""])


def _codex(binary: str, base_url: str, home: Path) -> tuple[list[str], dict[str, str]]:
    argv = [binary]
    for key, value in _codex_settings(base_url).items():
        argv += ["-c", f"{key}={value}"]
    # HOME too: Codex snapshots the user's login shell, whose profile's output would otherwise
    # come before every command's own.
    return argv, {"CODEX_HOME": str(home), "HOME": str(home), KEY_VAR: "lab-key"}


def _claude(binary: str, base_url: str, home: Path) -> tuple[list[str], dict[str, str]]:
    env = {
        "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
        "ANTHROPIC_API_KEY": "lab-key",
        "CLAUDE_CONFIG_DIR": str(home),
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    return [binary], env


def _gemini(binary: str, base_url: str, home: Path) -> tuple[list[str], dict[str, str]]:
    env = {
        "GOOGLE_GEMINI_BASE_URL": base_url.rstrip("/"),
        "GEMINI_API_KEY": "lab-key",
        "HOME": str(home),
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }
    return [binary, "--acp"], env


_PRESETS = {"codex-acp": _codex, "claude-code-acp": _claude, "gemini": _gemini}


def agent_env(
    name: str, base_url: str, home: Path, binary: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv and the whole environment to start agent ``name`` against ``base_url``.

    ``name`` is one of ``AGENTS``; ``base_url`` is the model server's root
    (``http://127.0.0.1:<port>``, no path: each preset adds its API's prefix); ``home`` an
    existing directory outside ``TMPDIR`` for the agent's config and history; ``binary`` the
    executable (default: ``name``, found on ``PATH``). Pure: reads only ``INHERITED``
    variables of this process. Raises ``UnknownAgent`` for another name."""
    preset = _PRESETS.get(name)
    if preset is None:
        raise UnknownAgent(f"no preset for agent {name!r}; known: {', '.join(AGENTS)}")
    argv, own = preset(binary or name, base_url, Path(home))
    env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return argv, {**env, **own}


def prepare_home(root: Path, name: str) -> Path:
    """Create and return ``root/name``: a fresh home for one agent process.

    ``root`` should lie outside ``TMPDIR`` (Codex's sandbox refuses a home under it)."""
    home = Path(root) / name
    home.mkdir(parents=True, exist_ok=True)
    return home
