"""Agents and their permission requests: ``GET /agents`` (the fleet's agent definitions),
``GET /sessions/{id}/permissions`` (requests waiting for a person) and
``POST /sessions/{id}/permissions/{requestId}`` (answer one)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import AUTH, StoreDep
from api.routes.bodies import PermissionAnswer
from orchestrator.agents import permissions
from orchestrator.agents.definitions import load
from orchestrator.session import sessions

router = APIRouter(dependencies=AUTH)


@router.get("/agents", tags=["agents"])
def list_agents(store: StoreDep) -> dict[str, Any]:
    """The agents sessions may name (``FLEET_AGENTS_FILE``), and the default one
    (``FLEET_AGENT``): ``{"agents": [{"name", "preset", "permissions"}], "default"}``."""
    catalog = load(store.settings.agents_file)
    return {
        "agents": [
            {"name": d.name, "preset": d.preset.value, "permissions": d.permissions.value}
            for d in (catalog.get(n) for n in catalog.names())
        ],
        "default": store.settings.agent,
    }


@router.get("/sessions/{session_id}/permissions", tags=["agents"])
def list_permissions(session_id: str, store: StoreDep) -> dict[str, Any]:
    """The session's permission requests waiting for a person, oldest first:
    ``{"permissions": [{requestId, turnId, toolCall, options, askedAt, expiresAt}]}``.
    404 for an unknown session."""
    sessions.get_session(store, session_id)
    return {"permissions": [p.to_wire() for p in permissions.pending(store, session_id)]}


@router.post("/sessions/{session_id}/permissions/{request_id}", tags=["agents"])
def answer_permission(
    session_id: str, request_id: str, body: PermissionAnswer, store: StoreDep
) -> dict[str, Any]:
    """Answer a waiting permission request: ``outcome`` is ``allow``, ``reject``,
    ``cancelled`` or one of its options' ids; the first answer wins. 404 when nothing waits
    under ``request_id`` (answered, timed out, or its turn ended); 422 for an outcome that
    names none of its options. Answers ``{"requestId", "optionId"}``."""
    sessions.get_session(store, session_id)
    chosen = permissions.answer(store, session_id, request_id, body.outcome)
    return {"requestId": request_id, "optionId": chosen}
