"""The ops endpoints: ``/healthz`` (liveness), ``/readyz`` (readiness), ``/metrics``
(Prometheus) and ``/v1/intents`` (the step intents ``POST /v1/context`` accepts)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from context_app.service.deps import Services
from context_app.service.http_deps import Svc
from context_app.service.metrics import CONTENT_TYPE_LATEST
from context_app.service.models import HealthResponse, IntentOut, ReadyResponse
from context_app.service.routes._common import resource_router
from context_core.config import Settings
from context_core.redis.connection import REDIS_ERRORS

__all__ = ["router"]

router = resource_router()


@router.get("/healthz", tags=["ops"], response_model=HealthResponse)
async def healthz() -> Response:
    """Liveness: the process answers. Never touches a backend and runs on the event loop,
    so it answers even while every worker thread is stuck on a hung Redis."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get(
    "/readyz",
    tags=["ops"],
    response_model=ReadyResponse,
    responses={503: {"model": ReadyResponse, "description": "a backend is down"}},
)
async def readyz(request: Request, svc: Svc) -> Response:
    """Readiness: Redis answers PING (within the service's Redis timeout), the namespace
    ACLs are present (re-synced if Redis lost them) and the vector store answers a count.
    Runs on its own two threads, never queued behind stuck request threads."""
    import anyio.to_thread

    limiter = getattr(request.app.state, "ready_limiter", None)
    checks, ok = await anyio.to_thread.run_sync(_readiness, svc, limiter=limiter)
    return JSONResponse(checks, status_code=200 if ok else 503)


@router.get(
    "/metrics",
    tags=["ops"],
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition",
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
        }
    },
)
def metrics(request: Request, svc: Svc) -> Response:
    """Prometheus exposition (the threshold pair in force and the requests in flight are
    read at scrape time)."""
    svc.metrics.set_thresholds(svc.router.policy_status())
    gauge = getattr(request.app.state, "load", None)
    svc.metrics.sample_process(gauge.inflight if gauge is not None else None)
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/intents", tags=["context"], response_model=dict[str, IntentOut])
def intents(svc: Svc) -> dict[str, Any]:
    """The step intents ``POST /v1/context`` accepts and the layers each loads."""
    return {
        s.name: {"l2": [k.kind for k in s.l2_keys], "l3": s.l3, "about": s.description}
        for s in svc.registry
    }


def _readiness(svc: Services) -> tuple[dict[str, Any], bool]:
    checks: dict[str, Any] = {}
    ok = True
    try:
        svc.redis.ping()  # bounded by CTX_SERVICE_REDIS_TIMEOUT_S
        checks["redis"] = "ok"
        sync = getattr(svc.namespaces, "acl_sync", None)
        if sync is not None:  # Redis restarted empty or flushed: grants come back here
            checks["acl"] = "resynced" if sync.check(force=True) else "ok"
    except REDIS_ERRORS as e:
        ok = False
        checks["redis"] = f"unreachable: {type(e).__name__}: {e}"
    try:
        name = svc.settings.collection_main
        checks["qdrant"] = "ok"
        checks["knowledge_points"] = svc.store.count(name) if svc.store.info(name) else 0
    except Exception as e:  # any store failure means not ready
        ok = False
        checks["qdrant"] = f"unreachable: {type(e).__name__}: {e}"
    checks["clamd"] = _clamd_status(svc.settings)  # reported; uploads fail closed alone
    checks["status"] = "ready" if ok else "not_ready"
    return checks, ok


def _clamd_status(settings: Settings) -> str:
    """The upload scanner as readiness reports it, without failing readiness: only uploads
    need it, and they refuse (503) by themselves while it is down."""
    if not settings.clamd_url:
        return "not configured"
    from context_core.ingest.clamd import ClamdScanner

    try:
        ClamdScanner(settings.clamd_url, timeout_s=min(1.0, settings.clamd_timeout_s)).ping()
    except Exception as e:  # unreachable, refused, timed out: said, never raised
        return f"unavailable: {type(e).__name__}"
    return "ok"
