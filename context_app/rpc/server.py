"""The gRPC server: ``context.v1.ContextService`` plus the standard health checking
(``grpc.health.v1.Health``) and reflection services, on grpc.aio.

It runs on the event loop of the HTTP app, started by the app's lifespan
(:func:`context_app.service.app.create_app` with ``CTX_GRPC_PORT``), over the same
:class:`~context_app.service.deps.Services` and load gauge: one platform, two protocols.
``ctx serve --grpc-port N --no-http`` runs the same lifespan without binding HTTP
(:func:`serve_grpc_only`).

Limits: messages over ``CTX_MAX_BODY_BYTES`` are refused with ``RESOURCE_EXHAUSTED`` naming the
setting (grpc itself drops any over twice that before reading it whole); at most
``CTX_GRPC_MAX_CONCURRENT_RPCS`` calls run at once (grpc answers ``RESOURCE_EXHAUSTED``
beyond), and together with the HTTP requests they count for ``CTX_DEGRADE_INFLIGHT`` and
``CTX_SHED_INFLIGHT``; each call is bounded by the same backend timeouts and CPU budgets as
over HTTP, and by the client's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from context_app.rpc.servicer import SERVICE, ContextServicer
from context_app.rpc.v1 import context_pb2, context_pb2_grpc
from context_app.service.deps import Services
from context_app.service.middleware import LoadGauge
from context_core.config import Settings

__all__ = ["GrpcServer", "serve_grpc_only", "start_grpc"]

log = logging.getLogger(__name__)


class GrpcServer:
    """A started server and its health servicer (set NOT_SERVING before it stops)."""

    def __init__(
        self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer, port: int
    ):
        self.server = server
        self.health = health_servicer
        self.port = port

    async def stop(self, grace_s: float = 5.0) -> None:
        with contextlib.suppress(Exception):
            await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start_grpc(svc: Services, gauge: LoadGauge, host: str, port: int) -> GrpcServer:
    """Bind ``host:port`` (0: any free port, see :attr:`GrpcServer.port`) and start."""
    cap = svc.settings.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 2 * cap),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ],
        maximum_concurrent_rpcs=svc.settings.grpc_max_concurrent_rpcs,
    )
    context_pb2_grpc.add_ContextServiceServicer_to_server(ContextServicer(svc, gauge), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        context_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"gRPC could not bind {host}:{port} (CTX_GRPC_PORT / --grpc-port)")
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    await health_servicer.set("", serving)
    await health_servicer.set(SERVICE, serving)
    return GrpcServer(server, health_servicer, bound)


async def serve_grpc_only(settings: Settings) -> None:
    """The HTTP app's lifespan (services, background jobs, the gRPC server) with no HTTP
    listener, until SIGINT or SIGTERM: ``ctx serve --grpc-port N --no-http``."""
    import signal

    from context_app.service.app import create_app

    app = create_app(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with app.router.lifespan_context(app):
        rpc: GrpcServer = app.state.grpc
        log.info("gRPC context service on %s:%d (no HTTP)", settings.service_host, rpc.port)
        await stop.wait()
