"""Install the three real ACP agents the tests and the benchmark drive, pinned, into a cache.

``python -m tests.agents.install [--cache DIR]`` installs each package of ``PACKAGES`` with
``npm install --prefix DIR/<pkg>@<ver> --no-audit --no-fund <pkg>@<ver>``; the cache is
``--cache``, else ``$FLEET_AGENT_CACHE``, else ``~/.cache/agent-fleet/agents``. A package whose
binary is already there is skipped, so a second run costs a few ``stat`` calls. It exits 0 when
all three are there and 1 otherwise, printing for each what happened (the tail of npm's
message when an install failed).

For tests: ``agent_binary(name)`` finds an installed binary; ``require_agent(name)`` returns it
or skips the test with the specific reason (not installed, npm missing, the registry
unreachable, npm's failure message, ``bwrap`` missing for Codex); it never skips silently.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

#: Seconds one ``npm install`` may take.
INSTALL_TIMEOUT = 600.0
#: Seconds the registry has to answer a ping.
PING_TIMEOUT = 5.0
#: How much of npm's output a failure keeps (characters, from the end).
TAIL = 1200
#: Where a failed install leaves npm's message, next to the package's directory.
FAILED_SUFFIX = ".failed"


@dataclass(frozen=True)
class Package:
    """One pinned npm package: ``spec`` (``name@version``) and the binary ``name`` it provides,
    at ``bin_path`` under ``node_modules`` (a native binary, where the package's ``.bin`` entry
    is a node wrapper that would add a process to the agent's tree)."""

    name: str
    spec: str
    bin_path: str


PACKAGES = (
    Package(
        "codex-acp",
        "@zed-industries/codex-acp@0.16.0",
        "@zed-industries/codex-acp-linux-x64/bin/codex-acp",
    ),
    Package("claude-code-acp", "@zed-industries/claude-code-acp@0.16.2", ".bin/claude-code-acp"),
    Package("gemini", "@google/gemini-cli@0.61.0", ".bin/gemini"),
)
BY_NAME = {p.name: p for p in PACKAGES}


class UnknownAgent(ValueError):
    """Raised when a name is not one of ``PACKAGES``."""


def cache_dir(override: Path | None = None) -> Path:
    """The cache root: ``override``, else ``$FLEET_AGENT_CACHE``, else the default."""
    if override is not None:
        return Path(override)
    env = os.environ.get("FLEET_AGENT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "agent-fleet" / "agents"


def _package(name: str) -> Package:
    if name not in BY_NAME:
        raise UnknownAgent(f"unknown agent {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def _prefix(package: Package, cache: Path | None) -> Path:
    return cache_dir(cache) / package.spec


def agent_binary(name: str, cache: Path | None = None) -> Path | None:
    """The installed binary of agent ``name`` (``codex-acp``, ``claude-code-acp``, ``gemini``),
    or ``None`` when it is not installed. Raises ``UnknownAgent`` for another name."""
    package = _package(name)
    path = _prefix(package, cache) / "node_modules" / package.bin_path
    return path if path.is_file() and os.access(path, os.X_OK) else None


def registry_reachable() -> str | None:
    """``None`` when npm's registry answers a ping, else why not (one line)."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (apt-get install npm, or nodejs from nodesource)"
    try:
        registry = (
            subprocess.run(
                [npm, "config", "get", "registry"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
            or "https://registry.npmjs.org/"
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"npm config get registry failed: {exc}"
    try:
        with urllib.request.urlopen(registry.rstrip("/") + "/-/ping", timeout=PING_TIMEOUT):
            return None
    except (urllib.error.URLError, OSError) as exc:
        return f"the npm registry {registry} is unreachable: {exc}"


def install(name: str, cache: Path | None = None) -> tuple[Path | None, str]:
    """Install agent ``name`` unless its binary is there: (binary or ``None``, what happened).

    A failure's message (npm's output tail) is also written next to the package's directory
    (``<pkg>@<ver>.failed``) for ``skip_reason`` to show; a success removes it."""
    package = _package(name)
    found = agent_binary(name, cache)
    if found is not None:
        return found, "already installed"
    prefix = _prefix(package, cache)
    failed = prefix.with_name(prefix.name + FAILED_SUFFIX)
    why = registry_reachable()
    if why is None:
        prefix.mkdir(parents=True, exist_ok=True)
        command = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund"]
        try:
            done = subprocess.run(
                [*command, package.spec], capture_output=True, text=True, timeout=INSTALL_TIMEOUT
            )
            output = (done.stdout + done.stderr).strip()
            why = None if done.returncode == 0 else f"npm exited {done.returncode}: {output}"
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"npm install failed: {exc}"
    found = agent_binary(name, cache)
    if found is None:
        why = why or f"npm succeeded but {package.bin_path} is missing"
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(why[-TAIL:])
        return None, why[-TAIL:]
    failed.unlink(missing_ok=True)
    return found, "installed"


def skip_reason(name: str, cache: Path | None = None) -> str | None:
    """Why agent ``name`` cannot run here (a sentence naming the fix), or ``None`` if it can."""
    package = _package(name)
    if name == "codex-acp" and shutil.which("bwrap") is None:
        return "codex-acp needs bwrap for its sandbox: apt-get install bubblewrap"
    if shutil.which("node") is None and name != "codex-acp":
        return f"{name} needs node (nodejs >= 20) on PATH"
    if agent_binary(name, cache) is not None:
        return None
    prefix = _prefix(package, cache)
    failed = prefix.with_name(prefix.name + FAILED_SUFFIX)
    if failed.is_file():
        return f"installing {package.spec} failed: {failed.read_text()}"
    return (
        f"{package.spec} is not installed in {cache_dir(cache)}: run "
        "`python -m tests.agents.install` (as .ci/run does)"
    )


def require_agent(name: str, cache: Path | None = None) -> Path:
    """The binary of agent ``name`` for a test, or a pytest skip saying exactly why not."""
    import pytest

    why = skip_reason(name, cache)
    binary = agent_binary(name, cache)
    if why is not None or binary is None:
        pytest.skip(f"REAL AGENT {name} UNAVAILABLE: {why}")
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.agents.install", description=__doc__)
    parser.add_argument("--cache", type=Path, default=None, help="cache root directory")
    args = parser.parse_args(argv)
    ok = True
    for package in PACKAGES:
        binary, what = install(package.name, args.cache)
        ok = ok and binary is not None
        print(f"{package.spec}: {what}" + (f" ({binary})" if binary else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
