"""The context service: the FastAPI app factory.

Stateless by design: L1 travels (signed) in every request, L2/L3 live in Redis/Qdrant, so
instances scale out behind a balancer. The endpoints are in :mod:`.routes` (one router per
resource, included here), error bodies in :mod:`.errors_map` (one handler maps every platform
error by its class), the body guard and request metrics in :mod:`.middleware`, and the
dependencies (services, calling agent) in :mod:`.http_deps`.

The hot endpoints return JSON encoded once from the library's wire models
(:mod:`context_core.session.wire`: the signed L1 state, the bundle); ``response_model`` on the route
publishes the same models in OpenAPI. FastAPI would otherwise re-validate and re-serialise
every response in a second worker-thread hop, which cost more CPU than the route itself;
tests/test_openapi_contract.py checks every endpoint's real answers against the published
schema instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from context_app.service.deps import Services, build_services
from context_app.service.direct_route import direct_routes_first
from context_app.service.errors_map import install_handlers, json_response, validation_body
from context_app.service.idle import sweep_idle_once
from context_app.service.middleware import BodyLimit, LoadGauge, LoadShed, RequestMetrics
from context_app.service.routes import OPENAPI_PATHS, ROUTERS
from context_app.service.routes.uploads import upload_raw_bodies
from context_core.config import Settings, get_settings

__all__ = ["create_app", "json_response", "validation_body"]

log = logging.getLogger(__name__)


# --- app -------------------------------------------------------------------------------------


async def _process_samples(svc: Services, gauge: LoadGauge, every_s: float = 2.0) -> None:
    """With several workers each one writes its own RSS / blocks / in-flight figures for the
    aggregated /metrics (a scrape reaches one worker only)."""
    while True:
        await asyncio.sleep(every_s)
        svc.metrics.sample_process(gauge.inflight)


async def _idle_sweeps(svc: Services, interval_s: float) -> None:
    """Every ``interval_s``: one idle sweep (one instance at a time), on the event loop with
    its round trips awaited (:mod:`.execution`), else on a worker thread: a thread would
    take the GIL from the loop at every one of its round trips."""
    import anyio.to_thread

    from context_core.concurrency import on_loop

    while True:
        await asyncio.sleep(interval_s)
        try:
            if svc.on_loop:
                await on_loop(sweep_idle_once, svc)
            else:
                await anyio.to_thread.run_sync(sweep_idle_once, svc)
        except Exception as e:  # a down Redis must not end the loop
            log.warning("idle sweep failed: %s: %s", type(e).__name__, e)


def create_app(settings: Settings | None = None, *, grpc_port: int | None = None) -> FastAPI:
    """The ASGI app. ``settings`` default to the environment (``CTX_*``), which is what
    ``uvicorn --factory context_app.service.app:create_app`` uses for each worker.
    ``grpc_port``: also serve gRPC (:mod:`context_app.rpc`) on it, from the lifespan, over the
    same services (default ``CTX_GRPC_PORT``; 0 there is no gRPC)."""
    settings = settings or get_settings()
    rpc_port = settings.grpc_port if grpc_port is None else grpc_port
    holder: dict[str, Services] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        svc = await anyio.to_thread.run_sync(build_services, settings)
        svc.start_loop()  # the hot endpoints on this loop (CTX_SERVICE_EXECUTION)
        holder["svc"] = svc
        app.state.services = svc
        # /readyz gets threads of its own: it must answer while hung requests hold the pool
        app.state.ready_limiter = anyio.CapacityLimiter(2)
        # torch + the embedding model leave ~0.5 M long-lived objects on the heap; every full
        # collection walked them (~230 ms stop-the-world, seen as p99 spikes and L3 timeouts
        # under load). Freezing moves them out of the collector's reach; new garbage is
        # still collected as usual. No unfreeze at shutdown: the process is ending, and other
        # apps in the same process (tests) keep their frozen heap.
        gc.collect()
        gc.freeze()
        # what requests in flight hold alive is young garbage to the collector: with the
        # default threshold (700) it was walked, and promoted, many times a second
        gc.set_threshold(settings.gc_gen0_threshold, *gc.get_threshold()[1:])
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.service_threads
        rpc = None
        if rpc_port:
            from context_app.rpc.server import start_grpc

            rpc = await start_grpc(svc, app.state.load, settings.service_host, rpc_port)
            app.state.grpc = rpc
        tasks = []
        if settings.idle_sweep_interval_s > 0:
            tasks.append(asyncio.create_task(_idle_sweeps(svc, settings.idle_sweep_interval_s)))
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            tasks.append(asyncio.create_task(_process_samples(svc, app.state.load)))
        try:
            yield
        finally:
            if rpc is not None:
                await rpc.stop()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            holder.pop("svc", None)
            await svc.stop_loop()
            await anyio.to_thread.run_sync(svc.close)

    app = FastAPI(
        title="Context service",
        version="1.0.0",
        summary="Layered context (L1 session, L2 working memory, L3 knowledge) for agents.",
        lifespan=lifespan,
    )
    install_handlers(app)
    # the routers' routes skip FastAPI's generic dependency solver when every parameter is
    # fine (anything else is answered by FastAPI's own handler): see .direct_route
    for router in ROUTERS:
        app.include_router(router)
    gauge = LoadGauge.from_settings(settings)
    app.state.load = gauge
    app.add_middleware(RequestMetrics, get_services=lambda: holder.get("svc"))
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, raw=upload_raw_bodies(settings)
    )
    # outermost: a shed request costs no body read, no routing, no thread
    app.add_middleware(LoadShed, gauge=gauge, get_services=lambda: holder.get("svc"))
    _direct_routes_searched_first(app)
    return app


def _direct_routes_searched_first(app: FastAPI) -> None:
    """The router tries the hot (direct) routes first; the OpenAPI document lists the paths in
    their published order (:data:`.routes.OPENAPI_PATHS`), the others in the order included."""
    rank = {path: i for i, path in enumerate(OPENAPI_PATHS)}
    included = sorted(app.router.routes, key=lambda r: rank.get(getattr(r, "path", ""), len(rank)))
    declared = {id(r): i for i, r in enumerate(included)}
    direct_routes_first(app.router.routes)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:  # generated once, synchronously: nothing routes meanwhile
            searched = app.router.routes
            app.router.routes = sorted(searched, key=lambda r: declared.get(id(r), len(declared)))
            try:
                generate()
            finally:
                app.router.routes = searched
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
