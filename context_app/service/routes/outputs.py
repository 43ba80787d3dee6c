"""``POST /v1/sessions/{id}/outputs``: the step's output, sanitized, recorded for CER."""

from __future__ import annotations

from fastapi.responses import Response

from context_app.service.cpu_budget import run_sanitizer
from context_app.service.execution import endpoint
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import OutputRequest, OutputResponse
from context_app.service.routes._common import (
    ERRORS,
    PathSessionId,
    opened_for,
    resource_router,
    unchanged_out,
)
from context_core.session.wire import encode_json

__all__ = ["router"]

router = resource_router()


@router.post(
    "/v1/sessions/{session_id}/outputs",
    tags=["sessions"],
    response_model=OutputResponse,
    responses=ERRORS,
)
@endpoint
def post_output(
    session_id: PathSessionId, body: OutputRequest, svc: Svc, who: Who, nbytes: BodyBytes
) -> Response:
    """Record the step's output for CER (the state comes back unchanged). The output is
    sanitized first (:mod:`context_core.gateway.output`): unsafe links and HTML, secrets
    and PII removed; the cleaned text is what is stored and returned (``output``), with
    what was removed (``removed``), also written to the audit file."""
    wire = opened_for(svc, body.state, session_id, who)
    sm = svc.wm.session(session_id)
    svc.run(  # the checks and the (owner-guarded) activity in one round trip
        [
            svc.quotas.charge_op(who.agent_id, nbytes, session_id=session_id),
            svc.owners.access_op("read", session_id, who.agent_id, wire.nonce, wire.version),
            sm.touch_op(svc.owners.owner_guard(session_id, who.agent_id)),
        ],
        "checking quotas and the session owner",
    )  # the quota's error first, as it is checked first
    step = wire.current_step if body.step is None else body.step
    clean = run_sanitizer(  # a long one off the loop, within CTX_OUTPUT_SANITIZE_BUDGET_MS
        body.output,
        gateway=svc.gateway,
        fmt=body.format,
        where=f"output:{session_id}:{body.trace_id}",
        budget_ms=svc.settings.output_sanitize_budget_ms,
    )
    svc.tracer.record_output(body.trace_id, session_id, step, clean.text)
    info = {"step": step, "trace_id": body.trace_id}
    removed = [r.to_dict() for r in clean.removed]
    out = unchanged_out(svc, body.state, wire, who.org)
    payload = b'{"state":%b,"session":%b,"info":%b,"output":%b,"removed":%b}' % (
        encode_json(out.sealed),
        encode_json(out.session),
        encode_json(info),
        encode_json(clean.text),
        encode_json(removed),
    )
    return Response(payload, media_type="application/json")
