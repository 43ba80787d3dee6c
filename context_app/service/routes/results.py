"""``GET /v1/sessions/{id}/results/{call id}``: the L2 copy of a tool call's args or result
kept when it was too big for L1 (the trace item and the step result point here)."""

from __future__ import annotations

from fastapi.responses import Response

from context_app.service.http_deps import Svc, Who
from context_app.service.models import ToolResultResponse
from context_app.service.routes._common import (
    ERRORS,
    PathCallId,
    PathSessionId,
    resource_router,
    wire_response,
)

__all__ = ["router"]

router = resource_router()


@router.get(
    "/v1/sessions/{session_id}/results/{call_id}",
    tags=["sessions"],
    response_model=ToolResultResponse,
    responses=ERRORS,
)
def get_result(session_id: PathSessionId, call_id: PathCallId, svc: Svc, who: Who) -> Response:
    """The L2 copy of a tool call's args (``<call id>.args``) or result, kept when it was
    too big for L1 (the trace item and step result point here)."""
    svc.owners.check(session_id, who.agent_id)
    loaded = svc.wm.session(session_id).load("result", call_id)
    return wire_response(
        {
            "session_id": session_id,
            "call_id": call_id,
            "key": loaded.key,
            "data": loaded.value,
            "stored_at": loaded.stored_at,
            "ttl_s": loaded.ttl_s,
        }
    )
