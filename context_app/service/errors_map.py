"""Error bodies of the HTTP API: one generic handler maps every platform error by its class.

Each :class:`~context_core.errors.ContextError` subclass carries its ``http_status`` and
``error_code`` (see :mod:`context_core.errors`, the one place that decides them); the handler
here only reads them, adds the class's ``details()`` and a ``Retry-After`` for 429/503. Request
validation errors keep FastAPI's ``loc``/``msg``/``type`` and say what was allowed: the enum
values, the pattern, the limit, or the JSON type expected. Input is never echoed.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisClusterException

from context_core.errors import (
    BackendUnavailableError,
    BlockedKeywordError,
    ContextError,
    ProfileValidationError,
)
from context_core.redis.connection import REDIS_ERRORS

__all__ = [
    "error_answer",
    "error_response",
    "install_handlers",
    "json_response",
    "validation_body",
]

_ENUM_TYPES = {"enum", "literal_error", "union_tag_invalid", "unknown_intent"}
_LIMIT_KEYS = ("limit", "max_length", "min_length", "le", "lt", "ge", "gt")
_EXPECTED = {
    "dict_type": "object",
    "model_type": "object",
    "model_attributes_type": "object",
    "list_type": "array",
    "tuple_type": "array",
    "string_type": "string",
    "int_type": "integer",
    "int_parsing": "integer",
    "int_from_float": "integer",
    "float_type": "number",
    "float_parsing": "number",
    "finite_number": "finite number",
    "bool_type": "boolean",
    "bool_parsing": "boolean",
    "scalar_type": "string, number, boolean or null",
}


def _allowed(err: Mapping[str, Any]) -> list[str] | None:
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


def validation_body(errors: list[Any]) -> dict[str, Any]:
    """FastAPI's ``loc``/``msg``/``type`` plus ``field`` (dotted, without ``body``) and what
    was allowed: ``allowed`` for enums, ``pattern``, ``limit`` (a length, bound or nesting
    depth) or ``expected`` (the JSON type). Never echoes input (it may hold a secret the
    gateway would have removed)."""
    detail = []
    for err in errors:
        kind = err.get("type", "")
        ctx = err.get("ctx") or {}
        item: dict[str, Any] = {
            "loc": list(err.get("loc", ())),
            "msg": err.get("msg", ""),
            "type": kind,
            "field": ".".join(str(p) for p in err.get("loc", ()) if p != "body"),
        }
        allowed = _allowed(err)
        if allowed is not None and kind in _ENUM_TYPES:
            item["allowed"] = allowed
        if kind == "string_pattern_mismatch" and "pattern" in ctx:
            item["pattern"] = str(ctx["pattern"])
        limit = next((ctx[k] for k in _LIMIT_KEYS if isinstance(ctx.get(k), int | float)), None)
        if limit is not None:
            item["limit"] = limit
        if kind in _EXPECTED:
            item["expected"] = _EXPECTED[kind]
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


def error_response(exc: ContextError) -> JSONResponse:
    """The answer to any platform error, from the attributes of its class."""
    status = type(exc).http_status
    headers = None
    if status in (429, 503):
        headers = {"Retry-After": str(exc.retry_after_s or 1)}
    body = {"error": type(exc).error_code, "detail": str(exc), **exc.details()}
    return JSONResponse(body, status_code=status, headers=headers)


def _backend_body(exc: Exception, metrics: Any = None) -> dict[str, Any]:
    """503's body for an unreachable Redis/vector store; counted per backend in ``metrics``.
    The detail names the backend and the error type only (driver messages may carry
    addresses)."""
    is_redis = isinstance(exc, REDIS_ERRORS) or "redis" in str(exc).lower()
    backend = "redis" if is_redis else "backend"
    if metrics is not None:
        metrics.backend_unavailable.labels(backend=backend).inc()
    return {
        "error": "backend_unavailable",
        "detail": f"{backend} is unreachable ({type(exc).__name__}); retry shortly",
        "backend": backend,
    }


def _backend_down(request: Request, exc: Exception) -> JSONResponse:
    svc = getattr(request.app.state, "services", None)
    body = _backend_body(exc, svc.metrics if svc is not None else None)
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})


_TOO_DEEP = {
    "error": "input_too_deep",
    "detail": "the request is nested too deeply to process; flatten it",
}


def error_answer(exc: BaseException, metrics: Any = None) -> tuple[int, dict[str, Any]] | None:
    """The HTTP status and body the handlers below answer ``exc`` with, for callers that are
    not FastAPI (the gRPC service maps them to status codes); None for an unexpected error
    (a 500). ``metrics``: where a backend outage is counted."""
    if isinstance(exc, RequestValidationError):
        return 422, validation_body(list(exc.errors()))
    if isinstance(exc, ProfileValidationError | BlockedKeywordError):
        return 422, validation_body([{**i, "loc": ("body", *i["loc"])} for i in exc.issues])
    if isinstance(exc, BackendUnavailableError | redis.RedisError | RedisClusterException):
        return 503, _backend_body(exc, metrics)
    if isinstance(exc, ContextError):
        body = json.loads(bytes(error_response(exc).body))
        return type(exc).http_status, body
    if isinstance(exc, RecursionError):
        return 422, dict(_TOO_DEEP)
    return None


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_body(list(exc.errors())), status_code=422)

    @app.exception_handler(ProfileValidationError)
    @app.exception_handler(BlockedKeywordError)
    async def _invalid_content(
        _r: Request, exc: ProfileValidationError | BlockedKeywordError
    ) -> JSONResponse:
        # the library's field errors, answered like request validation: 422 naming the field
        issues = [{**i, "loc": ("body", *i["loc"])} for i in exc.issues]
        return JSONResponse(validation_body(issues), status_code=422)

    @app.exception_handler(ContextError)
    async def _domain(request: Request, exc: ContextError) -> JSONResponse:
        if isinstance(exc, BackendUnavailableError):
            return _backend_down(request, exc)
        return error_response(exc)

    @app.exception_handler(redis.RedisError)
    async def _redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        return _backend_down(request, exc)

    @app.exception_handler(RedisClusterException)
    async def _cluster_down(request: Request, exc: RedisClusterException) -> JSONResponse:
        # redis-py's cluster client: no node answered the slot-map refresh, or no node
        # serves the key's slot (mid-failover); not a RedisError, still a 503
        return _backend_down(request, exc)

    @app.exception_handler(RecursionError)
    async def _too_deep(_r: Request, _exc: RecursionError) -> JSONResponse:
        # Belt and braces: the wire limits keep hostile depth out; should anything still
        # recurse too deep, the client hears that its input was too deep, not a 500.
        return JSONResponse(dict(_TOO_DEEP), status_code=422)
