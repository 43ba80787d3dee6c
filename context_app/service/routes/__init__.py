"""The service's routes: one :class:`~fastapi.APIRouter` per resource, each in its own module,
included by the app factory (:func:`context_app.service.app.create_app`) in ``ROUTERS``'
order. Dependencies (:mod:`~context_app.service.http_deps`) carry the services, the calling
agent and the body size; what the modules share is in :mod:`._common`.

Endpoints are plain ``def``: the memory layers are synchronous clients. The hot ones are
wrapped in :func:`~context_app.service.execution.endpoint` (on the event loop, their Redis
round trips awaited); the others run in FastAPI's worker threads.
"""

from __future__ import annotations

from fastapi import APIRouter

from context_app.service.routes.compliance import router as compliance_router
from context_app.service.routes.confirmations import router as confirmations_router
from context_app.service.routes.context import router as context_router
from context_app.service.routes.contract import router as contract_router
from context_app.service.routes.events import router as events_router
from context_app.service.routes.ops import router as ops_router
from context_app.service.routes.outputs import router as outputs_router
from context_app.service.routes.plan import router as plan_router
from context_app.service.routes.preferences import router as preferences_router
from context_app.service.routes.results import router as results_router
from context_app.service.routes.sessions import router as sessions_router
from context_app.service.routes.uploads import router as uploads_router

__all__ = [
    "OPENAPI_PATHS",
    "ROUTERS",
    "compliance_router",
    "confirmations_router",
    "context_router",
    "contract_router",
    "events_router",
    "ops_router",
    "outputs_router",
    "plan_router",
    "preferences_router",
    "results_router",
    "sessions_router",
    "uploads_router",
]

ROUTERS: tuple[APIRouter, ...] = (
    ops_router,
    sessions_router,
    events_router,
    context_router,
    outputs_router,
    results_router,
    contract_router,
    plan_router,
    confirmations_router,
    preferences_router,
    compliance_router,
    uploads_router,
)

OPENAPI_PATHS: tuple[str, ...] = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/intents",
    "/v1/sessions",
    "/v1/sessions/{session_id}/events",
    "/v1/context",
    "/v1/sessions/{session_id}/outputs",
    "/v1/sessions/{session_id}/state",
    "/v1/sessions/{session_id}/results/{call_id}",
    "/v1/sessions/{session_id}/contract",
    "/v1/sessions/{session_id}/contract/history",
    "/v1/sessions/{session_id}",
    "/v1/sessions/{session_id}/plan",
    "/v1/sessions/{session_id}/confirmations",
    "/v1/sessions/{session_id}/preferences",
    "/v1/sessions/{session_id}/preferences/{pref_type}",
    "/v1/compliance/orgs/{org_id}",
    "/v1/compliance/orgs/{org_id}/history",
    "/v1/compliance/orgs/{org_id}/users/{user_id}",
    "/v1/compliance/orgs/{org_id}/users/{user_id}/history",
    "/v1/uploads",
)
"""The order the OpenAPI document lists the paths in: the one it had before the routes were
split by resource, kept so the published document stays the same. A path not named here
follows these, in ``ROUTERS``' order; within a path the methods keep their router's order."""
