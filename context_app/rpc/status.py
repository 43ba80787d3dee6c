"""Errors of the gRPC service: the HTTP API's answer to the same error, as a gRPC status.

The route code raises what it raises over HTTP; :func:`~context_app.service.errors_map.
error_answer` gives the HTTP status and body, and this module maps the status to a gRPC code
and the body to a ``google.rpc.Status`` (the ``grpc-status-details-bin`` trailer, read with
``grpc_status.rpc_status.from_call``) holding:

* ``ErrorInfo``: ``reason`` is the HTTP body's ``error`` (``stale_state``,
  ``invalid_request`` ...), ``domain`` ``context.v1``, ``metadata`` the body's other fields
  (``http_status``, ``session_id``, ``limit_bytes``, ``retry_after_s`` ...) as strings;
* ``BadRequest``: one field violation per invalid field (``field``: its path in the request
  message, e.g. ``event.tool_call.name``; ``description``: what is wrong and what is allowed);
* ``RetryInfo`` for ``UNAVAILABLE`` and quota answers, the HTTP ``Retry-After``.

The status message is the HTTP ``detail`` (for validation: the fields and their messages).
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = ["CODES", "DOMAIN", "grpc_status_of"]

DOMAIN = "context.v1"

#: HTTP status of the same error -> gRPC code.
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    423: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def _packed(detail: Any) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(detail)
    return out


def _violation(item: dict[str, Any]) -> error_details_pb2.BadRequest.FieldViolation:
    extra = [
        f"{k}: {json.dumps(item[k], ensure_ascii=False)}"
        for k in ("allowed", "pattern", "limit", "expected")
        if item.get(k) is not None
    ]
    text = item.get("msg", "") + (f" ({'; '.join(extra)})" if extra else "")
    return error_details_pb2.BadRequest.FieldViolation(
        field=item.get("field", ""), description=text
    )


def grpc_status_of(http_status: int, body: dict[str, Any]) -> grpc.Status:
    """The gRPC status answering what HTTP answers with ``http_status`` and ``body``."""
    code = CODES.get(http_status, grpc.StatusCode.INTERNAL)
    reason = str(body.get("error") or ("unauthenticated" if http_status == 401 else "error"))
    detail = body.get("detail", "")
    details = []
    if isinstance(detail, list):  # request validation: one entry per field
        violations = [_violation(i) for i in detail if isinstance(i, dict)]
        message = "invalid request: " + "; ".join(
            f"{v.field or '(request)'}: {v.description}" for v in violations
        )
        details.append(_packed(error_details_pb2.BadRequest(field_violations=violations)))
    else:
        message = str(detail)
    metadata = {"http_status": str(http_status)}
    for k, v in body.items():
        if k not in ("error", "detail"):
            metadata[k] = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    details.insert(
        0, _packed(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata))
    )
    if http_status in (429, 503):
        wait = body.get("retry_after_s") or 1
        details.append(
            _packed(
                error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(wait)))
            )
        )
    st = status_pb2.Status(code=code.value[0], message=message, details=details)
    return rpc_status.to_status(st)


def internal_status() -> grpc.Status:
    """An unexpected error: nothing of it is sent (it may name internals)."""
    st = status_pb2.Status(
        code=code_pb2.INTERNAL, message="internal error; the service logged it", details=[]
    )
    return rpc_status.to_status(st)
