"""Routes for operators: ``GET /metrics`` (Prometheus), ``GET /ready`` (readiness),
``GET /audit`` and ``GET /sessions/{id}/audit`` (the audit trail)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse

from api import metrics as api_metrics
from api.context import dispatcher, store
from orchestrator import audit, sessions
from orchestrator.heartbeats import live_workers

log = logging.getLogger(__name__)

#: Seconds the broker check waits for a connection.
BROKER_TIMEOUT = 2.0


def broker_reachable() -> bool:
    """Whether the Celery broker answers a ping now, within ``BROKER_TIMEOUT`` seconds to
    connect and as long again to answer (a frozen broker is not reachable)."""
    try:
        # A socket timeout too: a frozen server accepts the connection and never answers.
        bounded = {"socket_timeout": BROKER_TIMEOUT, "socket_connect_timeout": BROKER_TIMEOUT}
        with dispatcher().app.connection_for_write(
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


def readiness() -> tuple[bool, dict[str, Any]]:
    """``(ready, body)``: ready when Redis answers, the broker is reachable and every family
    has at least one live worker. ``body`` is ``{"redis", "broker", "workers": {family:
    [node, ...]}}``."""
    st = store()
    try:
        st.redis.ping()
        workers = live_workers(st)
        redis_ok = True
    except Exception as exc:  # redis-py errors and StoreUnavailable alike
        log.info("readiness: redis not reachable: %s: %s", type(exc).__name__, exc)
        redis_ok, workers = False, {}
    broker_ok = broker_reachable()
    ready = redis_ok and broker_ok and bool(workers) and all(workers.values())
    return ready, {"redis": redis_ok, "broker": broker_ok, "workers": workers}


def router(auth: list[Any]) -> APIRouter:
    """The operator routes; ``auth`` guards all but ``/ready`` (a probe carries no token)."""
    r = APIRouter(tags=["ops"])
    reg = api_metrics.registry(store)

    @r.get(
        "/ready",
        responses={503: {"description": "Not ready; the same body says what is missing."}},
    )
    def ready() -> JSONResponse:
        """Readiness: 200 when Redis and the broker answer and each family has a live
        worker; 503 with the same body otherwise."""
        ok, body = readiness()
        return JSONResponse(body, status_code=200 if ok else 503)

    @r.get("/metrics", dependencies=auth, response_class=Response)
    def metrics_() -> Response:
        """The fleet's metrics in the Prometheus text format (read from Redis per scrape)."""
        return Response(api_metrics.render(reg), media_type=api_metrics.CONTENT_TYPE)

    @r.get("/audit", dependencies=auth)
    def audit_all(
        limit: Annotated[int, Query(ge=1, le=audit.MAX_READ)] = 50,
        before: Annotated[str | None, Query(description="Entry id to page on from.")] = None,
    ) -> dict[str, Any]:
        """The fleet-wide audit trail, newest first."""
        return _page(audit.read(store(), None, limit, before), limit)

    @r.get("/sessions/{session_id}/audit", dependencies=auth)
    def audit_session(
        session_id: str,
        limit: Annotated[int, Query(ge=1, le=audit.MAX_READ)] = 50,
        before: Annotated[str | None, Query(description="Entry id to page on from.")] = None,
    ) -> dict[str, Any]:
        """A session's audit trail, newest first (kept after the session is deleted)."""
        sid = sessions.get_session(store(), session_id, include_deleted=True).session_id
        body = _page(audit.read(store(), sid, limit, before), limit)
        return {"sessionId": sid, **body}

    return r


def _page(entries: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": entries}
    if len(entries) == limit:
        out["nextBefore"] = entries[-1]["id"]
    return out
