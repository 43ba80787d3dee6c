"""``POST /v1/context``: route one step and answer its bundle (or the delta since one)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.execution import endpoint
from context_app.service.http_deps import Svc, Who
from context_app.service.middleware import LoadGauge
from context_app.service.models import ContextDeltaResponse, ContextRequest, ContextResponse
from context_app.service.routes._common import (
    ERRORS,
    agent_auth,
    opened_for,
    resource_router,
    wire_response,
)
from context_core.access.auth import AgentKey
from context_core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    ContextMissError,
    StaleStateError,
    UnknownSessionError,
)
from context_core.redis.connection import REDIS_ERRORS
from context_core.routing.router import ContextBundle

__all__ = ["answer_context", "router"]

router = resource_router()


@router.post(
    "/v1/context",
    tags=["context"],
    response_model=ContextResponse | ContextDeltaResponse,
    responses=ERRORS,
)
@endpoint
def load_context(body: ContextRequest, svc: Svc, who: Who, request: Request) -> Response:
    """Route one step: the bundle of L1/L2/L3/shared fragments, each with provenance.
    Under load (``CTX_DEGRADE_INFLIGHT`` requests in flight) L3 is skipped and the bundle
    says ``degraded: true``; past ``CTX_SHED_INFLIGHT`` the service answers 503.
    With ``"delta": true`` the answer is a ContextDeltaResponse: what changed since the
    bundle ``since_bundle`` names (``context_core.routing.delta``)."""
    return wire_response(answer_context(svc, body, who, getattr(request.app.state, "load", None)))


def answer_context(
    svc: Services, body: ContextRequest, who: AgentKey, gauge: LoadGauge | None
) -> dict[str, Any]:
    """The answer to one context request, as its wire dict (a ContextResponse, or a
    ContextDeltaResponse with ``delta``): what HTTP (above) and gRPC
    (:mod:`context_app.rpc`) both send. ``gauge``: the worker's requests in flight, which
    decide whether L3 is skipped."""
    _known_intent(svc, body.step_intent)
    bundle, skip = _route(svc, body, who, gauge)
    _observe(svc, body, bundle, skip)
    return bundle.to_delta_dict() if body.delta else bundle.to_dict()


def _known_intent(svc: Services, step_intent: str) -> None:
    allowed = svc.intents()
    if step_intent not in allowed:
        raise RequestValidationError(
            [
                {
                    "type": "unknown_intent",
                    "loc": ("body", "step_intent"),
                    "msg": f"unknown step_intent {step_intent!r}",
                    "ctx": {"allowed": allowed},
                }
            ]
        )


def _route(
    svc: Services, body: ContextRequest, who: AgentKey, gauge: LoadGauge | None
) -> tuple[ContextBundle, str | None]:
    """The router's bundle for the request's step and why L3 was skipped (None: it was not);
    a failure is counted by its reason."""
    m = svc.metrics
    try:
        wire = opened_for(svc, body.state, body.session_id, who)
        state = wire.to_state(gateway=svc.gateway, auth=agent_auth(who))
        skip = gauge.degrade_reason() if gauge is not None else None
        sid = body.session_id
        bundle = svc.router.route(  # the owner check rides on the route's round trip
            state,
            body.step_intent,
            params=body.params.model_dump(exclude_unset=True),
            agent_id=who.agent_id,
            skip_l3=skip,
            delta=body.delta,
            since_bundle=body.since_bundle,
            preflight=svc.owners.access_op("read", sid, who.agent_id, wire.nonce, wire.version),
            touch_guard=svc.owners.owner_guard(sid, who.agent_id),
        )
    except ContextMissError:
        m.load_failures.labels(reason="l2_miss").inc()
        m.l2_misses.inc()
        raise
    except (BackendUnavailableError, *REDIS_ERRORS):
        m.load_failures.labels(reason="backend").inc()
        raise
    except (AccessDeniedError, UnknownSessionError, StaleStateError, RequestValidationError):
        raise
    except Exception:
        m.load_failures.labels(reason="error").inc()
        raise
    return bundle, skip


def _observe(svc: Services, body: ContextRequest, bundle: ContextBundle, skip: str | None) -> None:
    m = svc.metrics
    spec = svc.registry.get(body.step_intent)
    m.observe_bundle(bundle.timings_ms, l3_requested=bool(spec.l3) and skip is None)
    if bundle.degraded:
        m.degraded.inc()
    misses = len(bundle.l2_missing)  # optional keys the step went without
    if misses > 0:
        m.l2_misses.inc(misses)
