"""``POST /v1/sessions/{id}/confirmations``: answers the user confirmed, e.g. after a route
reported ``context_used.fallback`` (the user referred to something taught earlier that L3
does not hold). They go to hot knowledge right away, cleaned by the gateway and trust-scoped
exactly like ``goal_achieved``'s answers (the writer is the calling agent). The request is
session activity: it refreshes the task contract's lifetime and the idle clock.
"""

from __future__ import annotations

from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response

from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import ConfirmationRequest, ConfirmationResponse
from context_app.service.routes._common import (
    ERRORS,
    PathSessionId,
    agent_auth,
    opened_for,
    resource_router,
    wire_response,
)

__all__ = ["router"]

router = resource_router()


@router.post(
    "/v1/sessions/{session_id}/confirmations",
    status_code=201,
    tags=["sessions"],
    response_model=ConfirmationResponse,
    responses=ERRORS,
)
def post_confirmations(
    session_id: PathSessionId,
    body: ConfirmationRequest,
    svc: Svc,
    who: Who,
    nbytes: BodyBytes,
) -> Response:
    """User-confirmed answers to hot knowledge, now (written as the calling agent). An
    answer holding a blocked keyword of the session's compliance profile is refused
    (422 naming the field and the keyword); nothing is written then."""
    wire = opened_for(svc, body.state, session_id, who)
    svc.quotas.charge(who.agent_id, nbytes, session_id=session_id)
    svc.owners.verify(session_id, who.agent_id, wire.nonce, wire.version)
    state = wire.to_state(gateway=svc.gateway, auth=agent_auth(who))
    answers = [a.model_dump(exclude_none=True) for a in body.answers]
    confirmed = svc.lifecycle.confirm_answers(state, answers, org_id=who.org)
    svc.wm.session(session_id).touch()
    return wire_response({"session_id": session_id, "confirmed": jsonable_encoder(confirmed)}, 201)
