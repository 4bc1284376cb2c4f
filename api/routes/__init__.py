"""The HTTP API's routes, one module per resource: ``sessions``, ``turns``, ``archive``,
``events`` (Server-Sent Events), ``operations`` (health, readiness, metrics, audit) and
``websocket`` (ACP over ``/acp``). Request bodies live in ``bodies``. Each module has one
``router``; ``ROUTERS`` is the order ``create_app`` includes them in."""

from __future__ import annotations

from fastapi import APIRouter

from api.routes import agents, archive, events, operations, sessions, turns, websocket

#: In inclusion order: ``POST /sessions/archive`` (bulk) before the ``/sessions/{id}`` routes.
ROUTERS: tuple[APIRouter, ...] = (
    operations.router,
    archive.router,
    sessions.router,
    agents.router,
    turns.router,
    events.router,
    websocket.router,
)
