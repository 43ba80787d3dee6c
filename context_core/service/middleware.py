"""ASGI middleware of the service: the body guard and per-route request metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

from context_core.service.errors_map import validation_body
from context_core.service.limits import MAX_BODY_DEPTH, raw_body_problem

__all__ = ["ASGIApp", "BodyLimit", "RequestMetrics"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SCAN_IN_THREAD = 16 * 1024
"""Bodies bigger than this are checked on a worker thread, not on the event loop."""


class BodyLimit:
    """Guard every request body before the app parses it.

    Over ``max_bytes`` is a 413: by Content-Length up front, and by counting the streamed
    bytes (chunked uploads have no length). A body that is not UTF-8, or nests brackets
    deeper than ``max_depth``, is a 422 in the usual validation format, naming the keys on
    the way to the deep part: Python's JSON parser recurses, and would otherwise fail with a
    RecursionError (see :mod:`.limits`; the check is linear and recursion-free).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int = MAX_BODY_DEPTH) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

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
        if body:
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
                m = svc.metrics
                m.request_seconds.labels(name, scope["method"]).observe(time.perf_counter() - t0)
                m.requests.labels(name, scope["method"], str(status)).inc()
