"""The ``fleet`` command line (typer), one module per group of commands.

``fleet up`` and ``fleet demo`` start an embedded Redis when ``FLEET_REDIS_URL`` is unset;
every other command uses ``FLEET_REDIS_URL`` or, unset, the ``fleet up`` published in its state
directory (``localfleet/discovery.py``). Exit status and the JSON error shape: ``api.cli.common``.

- ``sessions``: ``sessions ls|show|new``, ``activity``, ``audit``;
- ``turns``: ``prompt`` (follows the turn unless ``--detach``);
- ``archive``: ``archive`` (one session), ``unarchive``, ``delete``;
- ``bulk``: ``bulk-archive``, ``auto-archive`` (also ``archive --bulk``, ``archive --auto``);
- ``processes``: ``worker``, ``up``, ``api``, ``beat``, ``flower``, ``acp``, ``demo``;
- ``ops``: ``reconcile``, ``sweep``;
- ``agents``: ``agents`` (list), ``agents check NAME``.

A new command goes in the module of its group, decorated with ``@app.command()`` from
``api.cli.common``; importing the module here registers it.
"""

from __future__ import annotations

from typing import Any

from api.cli import agents, archive, bulk, ops, processes, sessions, turns
from api.cli.common import app
from api.cli.listen import api_bind_address

__all__ = [
    "app",
    "agents",
    "api_bind_address",
    "main",
    "archive",
    "bulk",
    "ops",
    "processes",
    "sessions",
    "turns",
]


def main() -> Any:
    """Console-script entry point."""
    return app()
