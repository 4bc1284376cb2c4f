"""Routes for operators: ``GET /health`` (liveness), ``GET /ready`` (readiness), ``GET
/metrics`` (Prometheus), ``GET /audit`` and ``GET /sessions/{id}/audit`` (the audit trail).
``/health`` and ``/ready`` take no token (a probe carries none) and answer ``HEAD`` too."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse

from api import metrics as api_metrics
from api.deps import AUTH, DispatcherDep, StoreDep
from api.routes.bodies import QUERY_INT
from orchestrator.families import Dispatcher
from orchestrator.process import containment
from orchestrator.session import sessions
from orchestrator.storage import audit
from orchestrator.storage.heartbeats import live_workers
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: Seconds the broker check waits for a connection.
BROKER_TIMEOUT = 2.0

router = APIRouter(tags=["ops"])


def broker_reachable(dispatcher: Dispatcher) -> bool:
    """Whether the Celery broker of ``dispatcher`` (its ``app``) answers a ping now, within
    ``BROKER_TIMEOUT`` seconds to connect and as long again to answer (a frozen broker is not
    reachable). A dispatcher without a Celery app has no broker to reach: ``False``."""
    try:
        # A socket timeout too: a frozen server accepts the connection and never answers.
        bounded = {"socket_timeout": BROKER_TIMEOUT, "socket_connect_timeout": BROKER_TIMEOUT}
        app = dispatcher.app  # type: ignore[attr-defined]
        with app.connection_for_write(
            connect_timeout=BROKER_TIMEOUT, transport_options=bounded
        ) as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT
            )
            conn.default_channel.client.ping()
    except Exception as exc:  # any transport error means "not reachable"
        log.info("readiness: broker not reachable: %s: %s", type(exc).__name__, exc)
        return False
    return True


def readiness(store: Store, dispatcher: Dispatcher) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)``: ready when Redis answers, the broker is reachable and every family
    has at least one live worker. ``body`` is ``{"redis", "broker", "workers": {family:
    [node, ...]}, "containment"}``: ``containment`` is how this host contains the process
    trees the fleet starts (``cgroup``, ``pid-namespace``, ``subreaper``, or
    ``process-group``, where a process that leaves its group escapes;
    ``orchestrator/process/containment.py``)."""
    try:
        store.redis.ping()
        workers = live_workers(store)
        redis_ok = True
    except Exception as exc:  # redis-py errors and StoreUnavailable alike
        log.info("readiness: redis not reachable: %s: %s", type(exc).__name__, exc)
        redis_ok, workers = False, {}
    broker_ok = broker_reachable(dispatcher)
    ready = redis_ok and broker_ok and bool(workers) and all(workers.values())
    body = {"redis": redis_ok, "broker": broker_ok, "workers": workers}
    return ready, {**body, "containment": containment.mode().value}


# Liveness answers on the event loop itself (``async def``): it does no I/O, so it costs no
# hop to the thread pool, and it answers only when the loop does.
@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get(
    "/ready",
    responses={503: {"description": "Not ready; the same body says what is missing."}},
)
def ready(store: StoreDep, dispatcher: DispatcherDep) -> JSONResponse:
    """Readiness: 200 when Redis and the broker answer and each family has a live
    worker; 503 with the same body otherwise."""
    ok, body = readiness(store, dispatcher)
    return JSONResponse(body, status_code=200 if ok else 503)


# HEAD, which load balancers and health checkers send: the same status, no body. Kept out of
# the OpenAPI document (one operation per path and method would repeat each GET's).
@router.head("/health", include_in_schema=False)
async def health_head() -> Response:
    """Liveness for a HEAD probe: 200, no body."""
    return Response(status_code=200)


@router.head("/ready", include_in_schema=False)
def ready_head(store: StoreDep, dispatcher: DispatcherDep) -> Response:
    """Readiness for a HEAD probe: 200 or 503 as ``GET /ready`` answers, no body."""
    ok, _body = readiness(store, dispatcher)
    return Response(status_code=200 if ok else 503)


@router.get("/metrics", dependencies=AUTH, response_class=Response)
def metrics_(store: StoreDep) -> Response:
    """The fleet's metrics in the Prometheus text format (read from Redis per scrape)."""
    registry = api_metrics.registry(lambda: store)
    return Response(api_metrics.render(registry), media_type=api_metrics.CONTENT_TYPE)


@router.get("/audit", dependencies=AUTH)
def audit_all(
    store: StoreDep,
    limit: Annotated[int, QUERY_INT, Query(ge=1, le=audit.MAX_READ)] = 50,
    before: Annotated[str | None, Query(description="Entry id to page on from.")] = None,
) -> dict[str, Any]:
    """The fleet-wide audit trail, newest first."""
    return _page(audit.read(store, None, limit, before), limit)


@router.get("/sessions/{session_id}/audit", dependencies=AUTH)
def audit_session(
    session_id: str,
    store: StoreDep,
    limit: Annotated[int, QUERY_INT, Query(ge=1, le=audit.MAX_READ)] = 50,
    before: Annotated[str | None, Query(description="Entry id to page on from.")] = None,
) -> dict[str, Any]:
    """A session's audit trail, newest first (kept after the session is deleted)."""
    sid = sessions.get_session(store, session_id, include_deleted=True).session_id
    body = _page(audit.read(store, sid, limit, before), limit)
    return {"sessionId": sid, **body}


def _page(entries: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": entries}
    if len(entries) == limit:
        out["nextBefore"] = entries[-1]["id"]
    return out
