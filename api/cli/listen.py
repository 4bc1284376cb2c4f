"""Where ``fleet api`` and ``fleet up`` listen: the address the API may bind without a token,
and a port checked free before the application is built."""

from __future__ import annotations

import errno
import socket

from rich.text import Text

from api.cli.common import LOOPBACK, err, usage


def api_host(requested: str, token: str) -> str:
    """The address the API binds for ``requested``: itself with a token or on loopback, else
    127.0.0.1 (``api_bind_address`` says why)."""
    return requested if token or requested in LOOPBACK else "127.0.0.1"


def free_to_listen(host: str, port: int, hint: str) -> None:
    """Return if ``port`` on ``host`` can be listened on now, bound as uvicorn binds it (every
    address the host resolves to, with ``SO_REUSEADDR``); else stop with a usage error (exit
    2) saying so, ``hint`` telling what to change. Without it, uvicorn logs the bind error
    and exits 3, after the application was built."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        usage(f"cannot listen on {host}: {exc.strerror}.")
    for family, kind, proto, _name, address in found:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio binds it: not the IPv4 port too
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    usage(f"port {port} on {host} is in use: stop what listens there, or {hint}.")
                usage(f"cannot listen on {host} port {port}: {exc.strerror or exc}.")


def api_bind_address(requested: str, token: str) -> str:
    """The address the API may bind: any with a token configured; loopback only without one
    (said on stderr, since anyone who can reach the port could archive sessions)."""
    if api_host(requested, token) == requested:
        return requested
    err.print(
        Text(
            f"FLEET_API_TOKEN is not set: binding to 127.0.0.1 instead of {requested}. "
            "Set a token to serve the API beyond this machine.",
            "yellow",
        )
    )
    return "127.0.0.1"
