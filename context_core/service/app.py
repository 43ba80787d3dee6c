"""The context service: FastAPI app factory, endpoints and error mapping.

Stateless by design: L1 travels (signed) in every request, L2/L3 live in Redis/Qdrant, so
instances scale out behind a balancer. Endpoints are plain ``def``: the memory layers are
synchronous clients, so FastAPI runs them in its worker threads. Dependencies that never block
(finding the services, hashing the API key) are ``async`` so they cost no extra thread hop.

The hot endpoints return pre-encoded JSON (:func:`json_response`) built from values the
service made itself; ``response_model`` on the route still publishes the schema in OpenAPI.
FastAPI would otherwise re-validate and re-serialise every response in a second worker-thread
hop, which cost more CPU than the route itself.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import numbers
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

import redis
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader

from context_core.config import Settings, get_settings
from context_core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    ContextError,
    ContextMissError,
    ContractLockedError,
    PayloadTooLargeError,
    UnknownEventError,
    VersionConflictError,
)
from context_core.service.auth import AgentKey
from context_core.service.deps import (
    Services,
    SessionExistsError,
    UnknownSessionError,
    build_services,
)
from context_core.service.metrics import CONTENT_TYPE_LATEST
from context_core.service.models import (
    CloseResponse,
    ContextRequest,
    ContextResponse,
    ContractResponse,
    CreateSessionRequest,
    EventRequest,
    OutputRequest,
    StateResponse,
    WireState,
    state_from_wire,
    state_to_wire_dict,
    verify_wire,
)

__all__ = ["create_app", "json_response"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, description="per-agent API key")


# --- middleware ------------------------------------------------------------------------------


class BodyLimit:
    """Refuse bodies over ``max_bytes`` with 413: by Content-Length up front, and by counting
    the streamed bytes (chunked uploads have no length) before the app sees any of it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send, int(declared))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            size += len(msg.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, send, size)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, size: int) -> None:
        resp = JSONResponse(
            {
                "error": "payload_too_large",
                "detail": f"request body of {size}+ bytes exceeds the {self.max_bytes}-byte "
                "limit (CTX_MAX_BODY_BYTES)",
                "limit_bytes": self.max_bytes,
            },
            status_code=413,
        )
        await resp(scope, _noop_receive, send)


async def _noop_receive() -> Message:
    return {"type": "http.disconnect"}


class RequestMetrics:
    """Latency per route template (not per raw path, so ids don't explode the label set)."""

    def __init__(self, app: ASGIApp, get_services: Callable[[], Services | None]) -> None:
        self.app = app
        self.get_services = get_services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def capture(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
            await send(msg)

        try:
            await self.app(scope, receive, capture)
        finally:
            svc = self.get_services()
            if svc is not None:
                route = scope.get("route")
                name = getattr(route, "path", None) or "unmatched"
                m = svc.metrics
                m.request_seconds.labels(name, scope["method"]).observe(time.perf_counter() - t0)
                m.requests.labels(name, scope["method"], str(status)).inc()


# --- error bodies ----------------------------------------------------------------------------


def _allowed(err: dict[str, Any]) -> list[str] | None:
    """The allowed values of an enum-like validation error, as a list."""
    ctx = err.get("ctx") or {}
    if "allowed" in ctx:
        return list(ctx["allowed"])
    raw = ctx.get("expected") or ctx.get("expected_tags")
    if raw is None:
        return None
    if isinstance(raw, list | tuple):
        return [str(v) for v in raw]
    parts = [p.strip().strip("'\"") for p in str(raw).replace(" or ", ", ").split(",")]
    return [p for p in parts if p]


def validation_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """FastAPI's ``loc``/``msg``/``type``, plus ``allowed`` for enums; never echoes input
    (it may hold a secret the gateway would have removed)."""
    detail = []
    for err in errors:
        item: dict[str, Any] = {
            "loc": list(err.get("loc", ())),
            "msg": err.get("msg", ""),
            "type": err.get("type", ""),
            "field": ".".join(str(p) for p in err.get("loc", ()) if p != "body"),
        }
        allowed = _allowed(err)
        if allowed is not None and err.get("type") in {
            "enum",
            "literal_error",
            "union_tag_invalid",
            "unknown_intent",
        }:
            item["allowed"] = allowed
        detail.append(item)
    return {"error": "invalid_request", "detail": detail}


def _json_default(obj: Any) -> Any:
    if isinstance(obj, numbers.Real):  # e.g. numpy scalars from a vector store
        return float(obj)
    return jsonable_encoder(obj)


def _finite(value: Any) -> Any:
    """Non-finite floats become null, as pydantic writes them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_response(
    payload: Any, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """Compact JSON straight from the C encoder; unusual values take FastAPI's encoder."""
    try:
        raw = json.dumps(
            payload,
            ensure_ascii=False,
            separators=(",", ":"),
            allow_nan=False,
            default=_json_default,
        )
    except (TypeError, ValueError):  # NaN/inf, non-string keys: the slow, forgiving path
        raw = json.dumps(
            _finite(jsonable_encoder(payload)), ensure_ascii=False, separators=(",", ":")
        )
    return Response(
        raw.encode("utf-8"),
        status_code=status_code,
        headers=dict(headers) if headers else None,
        media_type="application/json",
    )


def _error(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": code, "detail": detail, **extra}, status, headers=headers)


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_body(list(exc.errors())), status_code=422)

    @app.exception_handler(AccessDeniedError)
    async def _denied(_r: Request, exc: AccessDeniedError) -> JSONResponse:
        return _error(403, "forbidden", str(exc))

    @app.exception_handler(UnknownSessionError)
    async def _unknown(_r: Request, exc: UnknownSessionError) -> JSONResponse:
        return _error(404, "unknown_session", str(exc), session_id=exc.session_id)

    @app.exception_handler(SessionExistsError)
    async def _exists(_r: Request, exc: SessionExistsError) -> JSONResponse:
        return _error(409, "session_exists", str(exc), session_id=exc.session_id)

    @app.exception_handler(ContextMissError)
    async def _miss(_r: Request, exc: ContextMissError) -> JSONResponse:
        return _error(409, "context_miss", str(exc), key=exc.key)

    @app.exception_handler(VersionConflictError)
    async def _conflict(_r: Request, exc: VersionConflictError) -> JSONResponse:
        return _error(409, "version_conflict", str(exc))

    @app.exception_handler(ContractLockedError)
    async def _locked(_r: Request, exc: ContractLockedError) -> JSONResponse:
        return _error(423, "contract_locked", str(exc))

    @app.exception_handler(PayloadTooLargeError)
    async def _too_big(_r: Request, exc: PayloadTooLargeError) -> JSONResponse:
        return _error(413, "payload_too_large", str(exc))

    @app.exception_handler(UnknownEventError)
    async def _bad_event(_r: Request, exc: UnknownEventError) -> JSONResponse:
        return _error(422, "unknown_event", str(exc))

    @app.exception_handler(BackendUnavailableError)
    async def _down(request: Request, exc: BackendUnavailableError) -> JSONResponse:
        return _backend_down(request, "redis" if "redis" in str(exc).lower() else "backend", exc)

    @app.exception_handler(redis.RedisError)
    async def _redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        return _backend_down(request, "redis", exc)

    @app.exception_handler(ContextError)
    async def _domain(_r: Request, exc: ContextError) -> JSONResponse:
        return _error(409, "state_conflict", str(exc))


def _backend_down(request: Request, backend: str, exc: Exception) -> JSONResponse:
    svc: Services | None = getattr(request.app.state, "services", None)
    if svc is not None:
        svc.metrics.backend_unavailable.labels(backend=backend).inc()
    return _error(
        503,
        "backend_unavailable",
        f"{backend} is unreachable ({type(exc).__name__}); retry shortly",
        backend=backend,
    )


# --- app -------------------------------------------------------------------------------------


def create_app(settings: Settings | None = None) -> FastAPI:
    """The ASGI app. ``settings`` default to the environment (``CTX_*``), which is what
    ``uvicorn --factory context_core.service.app:create_app`` uses for each worker."""
    settings = settings or get_settings()
    holder: dict[str, Services] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        svc = await anyio.to_thread.run_sync(build_services, settings)
        holder["svc"] = svc
        app.state.services = svc
        # torch + the embedding model leave ~0.5 M long-lived objects on the heap; every full
        # collection walked them (~230 ms stop-the-world, seen as p99 spikes and L3 timeouts
        # under load). Freezing moves them out of the collector's reach; new garbage is
        # still collected as usual. No unfreeze at shutdown: the process is ending, and other
        # apps in the same process (tests) keep their frozen heap.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            holder.pop("svc", None)
            await anyio.to_thread.run_sync(svc.close)

    app = FastAPI(
        title="Context service",
        version="1.0.0",
        summary="Layered context (L1 session, L2 working memory, L3 knowledge) for agents.",
        lifespan=lifespan,
    )
    _install_handlers(app)
    _install_routes(app)
    app.add_middleware(RequestMetrics, get_services=lambda: holder.get("svc"))
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


async def services(request: Request) -> Services:
    svc: Services | None = getattr(request.app.state, "services", None)
    if svc is None:  # pragma: no cover - only before the lifespan ran
        raise HTTPException(503, "service is starting")
    return svc


Svc = Annotated[Services, Depends(services)]


async def agent(key: Annotated[str | None, Depends(API_KEY)], svc: Svc) -> AgentKey:
    found = svc.keys.authenticate(key)
    if found is None:
        raise HTTPException(
            401,
            "missing or unknown X-API-Key header",
            headers={"WWW-Authenticate": "APIKey"},
        )
    return found


Who = Annotated[AgentKey, Depends(agent)]


def _state_in(svc: Services, who: AgentKey, wire: WireState, session_id: str) -> Any:
    """Verify signature, identity and ownership, then rebuild L1 through the gateway."""
    from context_core.session import AuthContext

    if wire.session_id != session_id:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("body", "state", "session_id"),
                    "msg": f"state belongs to session {wire.session_id!r}, not {session_id!r}",
                }
            ]
        )
    if not verify_wire(wire, svc.state_key):
        raise AccessDeniedError(
            "state signature does not match: send the state exactly as the service returned it"
        )
    svc.owners.check(session_id, who.agent_id)
    auth = AuthContext(agent_id=who.agent_id, scopes=tuple(who.purposes))
    return state_from_wire(wire, gateway=svc.gateway, auth=auth)


def _contract_out(session_id: str, c: Any) -> ContractResponse:
    canon = json.dumps(
        {"version": c.version, "fields": c.fields}, sort_keys=True, separators=(",", ":")
    )
    return ContractResponse(
        session_id=session_id,
        version=c.version,
        fields=c.fields,
        corrected=c.corrected,
        locked=c.locked,
        sha256=hashlib.sha256(canon.encode()).hexdigest(),
    )


def _install_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"description": "a backend is down"}})
    def readyz(svc: Svc) -> Response:
        """Readiness: Redis answers PING and the vector store answers a count."""
        checks: dict[str, Any] = {}
        ok = True
        try:
            svc.redis.ping()
            checks["redis"] = "ok"
        except redis.RedisError as e:
            ok = False
            checks["redis"] = f"unreachable: {type(e).__name__}: {e}"
        try:
            name = svc.settings.collection_main
            checks["qdrant"] = "ok"
            checks["knowledge_points"] = svc.store.count(name) if svc.store.info(name) else 0
        except Exception as e:  # any store failure means not ready
            ok = False
            checks["qdrant"] = f"unreachable: {type(e).__name__}: {e}"
        checks["status"] = "ready" if ok else "not_ready"
        return JSONResponse(checks, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"], response_class=Response)
    def metrics(svc: Svc) -> Response:
        """Prometheus exposition."""
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/intents", tags=["context"])
    def intents(svc: Svc) -> dict[str, Any]:
        """The step intents ``POST /v1/context`` accepts and the layers each loads."""
        return {
            s.name: {"l2": [k.kind for k in s.l2_keys], "l3": s.l3, "about": s.description}
            for s in svc.registry
        }

    @app.post("/v1/sessions", status_code=201, tags=["sessions"], response_model=StateResponse)
    def create_session(
        body: CreateSessionRequest,
        svc: Svc,
        who: Who,
    ) -> Response:
        """Start a session owned by the calling agent; returns the signed L1 state."""
        from context_core.session import AuthContext

        sid = body.session_id or f"s-{uuid.uuid4().hex}"
        svc.owners.claim(sid, who.agent_id)
        try:
            result = svc.lifecycle.apply(
                "session_start",
                None,
                session_id=sid,
                user_id=body.user_id,
                user_query=body.user_query,
                auth=AuthContext(agent_id=who.agent_id, scopes=tuple(who.purposes)),
                contract=body.contract,
                device_id=body.device_id,
            )
        except BaseException:
            svc.owners.release(sid)
            raise
        return json_response(
            {
                "state": state_to_wire_dict(result.state, svc.state_key),
                "info": jsonable_encoder(result.effects),
            },
            201,
        )

    @app.post("/v1/sessions/{session_id}/events", tags=["sessions"], response_model=StateResponse)
    def post_event(
        session_id: str,
        body: EventRequest,
        svc: Svc,
        who: Who,
    ) -> Response:
        """A lifecycle event (tool_call, user_correction, context_overflow, session_timeout,
        goal_achieved, error_recovery); everything stored passes the gateway."""
        state = _state_in(svc, who, body.state, session_id)
        payload = body.event.model_dump(exclude={"type"}, exclude_none=True)
        result = svc.lifecycle.apply(body.event.type, state, **payload)
        info = {"event": body.event.type, **jsonable_encoder(result.effects)}
        return json_response(
            {"state": state_to_wire_dict(result.state, svc.state_key), "info": info}
        )

    @app.post(
        "/v1/context",
        tags=["context"],
        response_model=ContextResponse,
        responses={
            409: {"description": "a required L2 key is missing or expired"},
            503: {"description": "Redis is unreachable"},
        },
    )
    def load_context(
        body: ContextRequest,
        svc: Svc,
        who: Who,
    ) -> Response:
        """Route one step: the bundle of L1/L2/L3/shared fragments, each with provenance."""
        allowed = svc.intents()
        if body.step_intent not in allowed:
            raise RequestValidationError(
                [
                    {
                        "type": "unknown_intent",
                        "loc": ("body", "step_intent"),
                        "msg": f"unknown step_intent {body.step_intent!r}",
                        "ctx": {"allowed": allowed},
                    }
                ]
            )
        m = svc.metrics
        try:
            state = _state_in(svc, who, body.state, body.session_id)
            bundle = svc.router.route(
                state, body.step_intent, params=body.params, agent_id=who.agent_id
            )
        except ContextMissError:
            m.load_failures.labels(reason="l2_miss").inc()
            m.l2_misses.inc()
            raise
        except (BackendUnavailableError, redis.RedisError):
            m.load_failures.labels(reason="backend").inc()
            raise
        except (AccessDeniedError, UnknownSessionError, RequestValidationError):
            raise
        except Exception:
            m.load_failures.labels(reason="error").inc()
            raise
        spec = svc.registry.get(body.step_intent)
        m.observe_bundle(bundle.timings_ms, l3_requested=bool(spec.l3))
        if bundle.degraded:
            m.degraded.inc()
        found = len((bundle.context_used or {}).get("l2", ()))
        misses = len(spec.l2_keys) - found  # optional keys the step went without
        if misses > 0:
            m.l2_misses.inc(misses)
        return json_response(
            {
                "session_id": bundle.session_id,
                "step": bundle.step,
                "intent": bundle.intent,
                "fragments": [f.to_dict() for f in bundle.fragments],
                "degraded": bundle.degraded,
                "timings_ms": dict(bundle.timings_ms),
                "context_used": bundle.context_used or {},
                "trace_id": bundle.trace_id,
            }
        )

    @app.post("/v1/sessions/{session_id}/outputs", tags=["sessions"], response_model=StateResponse)
    def post_output(
        session_id: str,
        body: OutputRequest,
        svc: Svc,
        who: Who,
    ) -> Response:
        """Record the step's output for CER (the state comes back unchanged)."""
        state = _state_in(svc, who, body.state, session_id)
        step = state.current_step if body.step is None else body.step
        svc.tracer.record_output(body.trace_id, session_id, step, body.output)
        return json_response(
            {"state": body.state.model_dump(), "info": {"step": step, "trace_id": body.trace_id}}
        )

    @app.get("/v1/sessions/{session_id}/contract", tags=["sessions"])
    def get_contract(session_id: str, svc: Svc, who: Who) -> ContractResponse:
        """The current task contract with a content hash (used to check nothing was lost)."""
        svc.owners.check(session_id, who.agent_id)
        return _contract_out(session_id, svc.wm.session(session_id).contract())

    @app.delete("/v1/sessions/{session_id}", tags=["sessions"], response_model=CloseResponse)
    def close_session(session_id: str, svc: Svc, who: Who) -> Response:
        """Close the session: its working memory is deleted now rather than left to expire."""
        svc.owners.check(session_id, who.agent_id)
        n = svc.wm.session(session_id).clear()
        svc.owners.release(session_id)
        return json_response({"session_id": session_id, "deleted_keys": n})
