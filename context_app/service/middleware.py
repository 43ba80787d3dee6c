"""ASGI middleware of the service: load shedding, the body guard and per-route metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from context_app.service.errors_map import validation_body
from context_app.service.limits import MAX_BODY_DEPTH, raw_body_problem

__all__ = [
    "OPS_PATHS",
    "ASGIApp",
    "BodyLimit",
    "LoadGauge",
    "LoadShed",
    "RawBody",
    "RequestMetrics",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SCAN_IN_THREAD = 16 * 1024
"""Bodies bigger than this are checked on a worker thread, not on the event loop."""


#: Always served, whatever the load: probes and scrapes must see an overloaded service.
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class LoadGauge:
    """Requests in flight in this worker process, and the two steps of the degradation path.

    Only the event loop changes ``inflight`` (a plain int); endpoint threads only read it.
    From ``degrade_at`` on, context loads skip L3 (:meth:`degrade_reason`); from ``shed_at``
    on, new requests are answered 503 + ``Retry-After`` before their body is read. Both are
    per process, so with N workers the instance sheds at N x ``shed_at``.
    """

    def __init__(self, *, shed_at: int, degrade_at: int, retry_after_s: int = 1) -> None:
        self.shed_at = shed_at
        self.degrade_at = degrade_at
        self.retry_after_s = retry_after_s
        self.inflight = 0

    @classmethod
    def from_settings(cls, settings: Any) -> LoadGauge:
        return cls(
            shed_at=settings.shed_inflight,
            degrade_at=settings.degrade_inflight,
            retry_after_s=settings.shed_retry_after_s,
        )

    def degrade_reason(self) -> str | None:
        """Why L3 is skipped now, or None when the worker is not under pressure."""
        n = self.inflight
        if self.degrade_at and n >= self.degrade_at:
            return (
                f"skipped under load: {n} requests in flight in this worker "
                f"(CTX_DEGRADE_INFLIGHT={self.degrade_at})"
            )
        return None


class LoadShed:
    """Answer 503 + ``Retry-After`` instead of queueing once the worker holds ``shed_at``
    requests: a client that backs off for a second gets served then, where a queue would
    make every request wait seconds (the ops endpoints are never shed)."""

    def __init__(
        self, app: ASGIApp, gauge: LoadGauge, get_services: Callable[[], Any] = lambda: None
    ) -> None:
        self.app = app
        self.gauge = gauge
        self.get_services = get_services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPS_PATHS:
            await self.app(scope, receive, send)
            return
        g = self.gauge
        if g.shed_at and g.inflight >= g.shed_at:
            svc = self.get_services()
            if svc is not None:
                svc.metrics.shed.inc()
            resp = JSONResponse(
                {
                    "error": "overloaded",
                    "detail": f"the service holds {g.inflight} requests in this worker "
                    f"(CTX_SHED_INFLIGHT={g.shed_at}); retry after {g.retry_after_s} s",
                    "retry_after_s": g.retry_after_s,
                },
                status_code=503,
                headers={"Retry-After": str(g.retry_after_s)},
            )
            await resp(scope, _noop_receive, send)
            return
        g.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            g.inflight -= 1


@dataclass(frozen=True, slots=True)
class RawBody:
    """A route whose body is not JSON (a file upload): its own size limit, no JSON checks.
    ``setting`` names what sets ``max_bytes`` in the 413; ``envelope`` is what the body may
    carry beyond it (multipart boundaries and form fields)."""

    max_bytes: int
    setting: str
    envelope: int = 0


class BodyLimit:
    """Guard every request body before the app parses it.

    Over ``max_bytes`` is a 413: by Content-Length up front, and by counting the streamed
    bytes (chunked uploads have no length). A body that is not UTF-8, or nests brackets
    deeper than ``max_depth``, is a 422 in the usual validation format, naming the keys on
    the way to the deep part: Python's JSON parser recurses, and would otherwise fail with a
    RecursionError (see :mod:`.limits`; the check is linear and recursion-free).

    ``raw`` maps ``(method, path)`` of routes whose body is a file to a :class:`RawBody`:
    those get its limit (plus its envelope) and no JSON checks; every other route is guarded
    as above.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        max_depth: int = MAX_BODY_DEPTH,
        *,
        raw: Mapping[tuple[str, str], RawBody] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.raw = dict(raw or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        raw = self.raw.get((scope["method"], scope["path"])) if self.raw else None
        limit = raw.max_bytes + raw.envelope if raw is not None else self.max_bytes
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, send, int(declared), raw)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            size += len(msg.get("body", b""))
            if size > limit:
                await self._refuse(scope, send, size, raw)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and raw is None:
            if len(body) > _SCAN_IN_THREAD:
                import anyio.to_thread

                problem = await anyio.to_thread.run_sync(raw_body_problem, body, self.max_depth)
            else:
                problem = raw_body_problem(body, self.max_depth)
            if problem is not None:
                resp = JSONResponse(validation_body([problem]), status_code=422)
                await resp(scope, _noop_receive, send)
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, size: int, raw: RawBody | None) -> None:
        if raw is None:
            detail = (
                f"request body of {size}+ bytes exceeds the {self.max_bytes}-byte limit "
                "(CTX_MAX_BODY_BYTES)"
            )
            limit = self.max_bytes
        else:
            envelope = " plus the multipart envelope" if raw.envelope else ""
            detail = (
                f"upload body of {size}+ bytes exceeds the {raw.max_bytes}-byte file limit "
                f"({raw.setting}){envelope}"
            )
            limit = raw.max_bytes
        resp = JSONResponse(
            {"error": "payload_too_large", "detail": detail, "limit_bytes": limit},
            status_code=413,
        )
        await resp(scope, _noop_receive, send)


async def _noop_receive() -> Message:
    return {"type": "http.disconnect"}


class RequestMetrics:
    """Latency per route template (not per raw path, so ids don't explode the label set)."""

    def __init__(self, app: ASGIApp, get_services: Callable[[], Any]) -> None:
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
                svc.metrics.observe_request(name, scope["method"], status, time.perf_counter() - t0)
