"""``context.v1.ContextService``: each call runs the HTTP route's own code.

A call is admitted like an HTTP request (the shedding threshold on the same
:class:`~context_app.service.middleware.LoadGauge`, the API key from the metadata, the
message size against ``CTX_MAX_BODY_BYTES``), its message becomes the route's request body
(:mod:`.convert`), validated by the route's pydantic model, and the route function itself
runs, on the event loop as :func:`~context_app.service.execution.endpoint` runs it for HTTP.
Its answer goes back as a message; an error as the status :mod:`.status` maps it to.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypeVar

import grpc
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from context_app.rpc import convert
from context_app.rpc.status import grpc_status_of, internal_status
from context_app.rpc.v1 import context_pb2 as pb
from context_app.rpc.v1 import context_pb2_grpc as pb_grpc
from context_app.service.deps import Services
from context_app.service.errors_map import error_answer
from context_app.service.execution import endpoint
from context_app.service.middleware import LoadGauge
from context_app.service.models import (
    ID_PATTERN,
    ContextRequest,
    CreateSessionRequest,
    EventRequest,
    OutputRequest,
)
from context_app.service.routes.context import answer_context
from context_app.service.routes.events import post_event
from context_app.service.routes.outputs import post_output
from context_app.service.routes.sessions import close_session, create_session, get_state
from context_core.access.auth import AgentKey

__all__ = ["MAX_STREAM_STEPS", "SERVICE", "ContextServicer"]

log = logging.getLogger(__name__)

SERVICE = "context.v1.ContextService"

MAX_STREAM_STEPS = 16
"""Most steps one StreamContext call may ask for."""

_SESSION_ID = TypeAdapter(Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)])
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Refused(Exception):
    """Refused before the route ran: the HTTP status and body the same request gets."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail"))
        self.status = status
        self.body = body


def _validated(model: type[M], body: dict[str, Any]) -> M:
    """``body`` through the HTTP route's model; errors located like HTTP's (``body`` first)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_input=False)]
        ) from None


def _session_id(value: str) -> str:
    try:
        return _SESSION_ID.validate_python(value)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("body", "session_id")} for err in e.errors(include_input=False)]
        ) from None


def _json(resp: Response) -> dict[str, Any]:
    return json.loads(bytes(resp.body))


async def _sync(fn: Callable[..., T], **kwargs: Any) -> T:
    """A plain route function, on a worker thread as FastAPI runs it."""
    return await run_in_threadpool(fn, **kwargs)


class ContextServicer(pb_grpc.ContextServiceServicer):
    """The service's calls over one :class:`Services` (the HTTP app's, when both run)."""

    def __init__(self, svc: Services, gauge: LoadGauge) -> None:
        self.svc = svc
        self.gauge = gauge

    # --- admission, errors, metrics ------------------------------------------------------

    def _admit(self, request: Any, context: grpc.aio.ServicerContext) -> tuple[AgentKey, int]:
        g = self.gauge
        if g.shed_at and g.inflight >= g.shed_at:
            self.svc.metrics.shed.inc()
            raise Refused(
                503,
                {
                    "error": "overloaded",
                    "detail": f"the service holds {g.inflight} requests in this worker "
                    f"(CTX_SHED_INFLIGHT={g.shed_at}); retry after {g.retry_after_s} s",
                    "retry_after_s": g.retry_after_s,
                },
            )
        key = None
        for k, v in context.invocation_metadata() or ():
            if k == "authorization" and isinstance(v, str) and v[:7].lower() == "bearer ":
                key = v[7:].strip()
            elif k == "x-api-key" and key is None and isinstance(v, str):
                key = v
        who = self.svc.keys.authenticate(key) if key else None
        if who is None:
            raise Refused(
                401,
                {
                    "error": "unauthenticated",
                    "detail": "missing or unknown API key: send the metadata "
                    "'authorization: Bearer <key>' (or 'x-api-key: <key>')",
                },
            )
        size, cap = request.ByteSize(), self.svc.settings.max_body_bytes
        if size > cap:
            raise Refused(
                413,
                {
                    "error": "payload_too_large",
                    "detail": f"request message of {size} bytes exceeds the {cap}-byte limit "
                    "(CTX_MAX_BODY_BYTES)",
                    "limit_bytes": cap,
                },
            )
        return who, size

    def _status(self, exc: BaseException) -> grpc.Status:
        if isinstance(exc, Refused):
            return grpc_status_of(exc.status, exc.body)
        found = error_answer(exc, self.svc.metrics)
        if found is None:
            log.error("gRPC call failed: %s", type(exc).__name__, exc_info=exc)
            return internal_status()
        return grpc_status_of(*found)

    async def _unary(
        self,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        work: Callable[[AgentKey, int], Awaitable[T]],
    ) -> T:
        t0 = time.perf_counter()
        code = "OK"
        try:
            try:
                who, size = self._admit(request, context)
                self.gauge.inflight += 1
                try:
                    return await work(who, size)
                finally:
                    self.gauge.inflight -= 1
            except Exception as e:
                status = self._status(e)
                code = status.code.name
                await context.abort(status.code, status.details, status.trailing_metadata)
                raise AssertionError("abort returned") from None  # pragma: no cover
        finally:
            self.svc.metrics.observe_rpc(SERVICE, method, code, time.perf_counter() - t0)

    # --- calls -----------------------------------------------------------------------------

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.StateReply:
        async def work(who: AgentKey, size: int) -> pb.StateReply:
            body = _validated(CreateSessionRequest, convert.create_body(request))
            resp = await create_session(body=body, svc=self.svc, who=who, nbytes=size)
            return convert.state_reply(_json(resp))

        return await self._unary("CreateSession", request, context, work)

    async def GetState(
        self, request: pb.SessionRef, context: grpc.aio.ServicerContext
    ) -> pb.StateReply:
        async def work(who: AgentKey, size: int) -> pb.StateReply:
            sid = _session_id(request.session_id)
            resp = await _sync(get_state, session_id=sid, svc=self.svc, who=who)
            return convert.state_reply(_json(resp))

        return await self._unary("GetState", request, context, work)

    async def PostEvent(
        self, request: pb.EventRequest, context: grpc.aio.ServicerContext
    ) -> pb.StateReply:
        async def work(who: AgentKey, size: int) -> pb.StateReply:
            sid = _session_id(request.session_id)
            body = _validated(EventRequest, convert.event_body(request))
            resp = await post_event(session_id=sid, body=body, svc=self.svc, who=who, nbytes=size)
            return convert.state_reply(_json(resp))

        return await self._unary("PostEvent", request, context, work)

    async def _context(self, who: AgentKey, body: dict[str, Any]) -> dict[str, Any]:
        req = _validated(ContextRequest, body)
        run = endpoint(answer_context)
        return await run(svc=self.svc, body=req, who=who, gauge=self.gauge)

    async def GetContext(
        self, request: pb.ContextRequest, context: grpc.aio.ServicerContext
    ) -> pb.ContextBundle:
        async def work(who: AgentKey, size: int) -> pb.ContextBundle:
            body = convert.context_body(
                request.session_id, request.state, request.step_intent, request.params
            )
            return convert.bundle_message(await self._context(who, body))

        return await self._unary("GetContext", request, context, work)

    async def StreamContext(
        self, request: pb.ContextStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ContextDelta]:
        """One delta per step, each against the one before; an error ends the stream with
        its status (the deltas sent before it stay valid)."""
        t0 = time.perf_counter()
        code = "OK"
        counted = False
        try:
            try:
                who, _size = self._admit(request, context)
                self.gauge.inflight += 1
                counted = True
                n = len(request.steps)
                if not 1 <= n <= MAX_STREAM_STEPS:
                    raise RequestValidationError(
                        [
                            {
                                "type": "too_long" if n else "too_short",
                                "loc": ("body", "steps"),
                                "msg": f"steps should hold 1 to {MAX_STREAM_STEPS} steps, got {n}",
                                "ctx": {"limit": MAX_STREAM_STEPS},
                            }
                        ]
                    )
                since = request.since_bundle if request.HasField("since_bundle") else None
                for step in request.steps:
                    body = convert.context_body(
                        request.session_id,
                        request.state,
                        step.step_intent,
                        step.params,
                        delta=True,
                        since_bundle=since,
                    )
                    answer = await self._context(who, body)
                    since = answer["bundle_id"]
                    yield convert.delta_message(answer)
            except Exception as e:
                status = self._status(e)
                code = status.code.name
                await context.abort(status.code, status.details, status.trailing_metadata)
            finally:
                if counted:
                    self.gauge.inflight -= 1
        finally:
            self.svc.metrics.observe_rpc(SERVICE, "StreamContext", code, time.perf_counter() - t0)

    async def PostOutput(
        self, request: pb.OutputRequest, context: grpc.aio.ServicerContext
    ) -> pb.OutputReply:
        async def work(who: AgentKey, size: int) -> pb.OutputReply:
            sid = _session_id(request.session_id)
            body = _validated(OutputRequest, convert.output_body(request))
            resp = await post_output(session_id=sid, body=body, svc=self.svc, who=who, nbytes=size)
            return convert.output_reply(_json(resp))

        return await self._unary("PostOutput", request, context, work)

    async def CloseSession(
        self, request: pb.SessionRef, context: grpc.aio.ServicerContext
    ) -> pb.CloseReply:
        async def work(who: AgentKey, size: int) -> pb.CloseReply:
            sid = _session_id(request.session_id)
            resp = await close_session(session_id=sid, svc=self.svc, who=who)
            answer = _json(resp)
            return pb.CloseReply(
                session_id=answer["session_id"], deleted_keys=answer["deleted_keys"]
            )

        return await self._unary("CloseSession", request, context, work)
