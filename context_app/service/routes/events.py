"""``POST /v1/sessions/{id}/events``: a lifecycle event applied to the sealed L1 state.

An event holds the session's write lease while it runs and commits the new version at the
end; if anything fails, including a new state over ``CTX_L1_MAX_STATE_BYTES`` (413), nothing
is committed and the state the client sent stays the latest. Tool args/results over
``CTX_L1_MAX_RESULT_BYTES`` go to L2 (``wm:{<sid>}:result:<call id>``, readable with
``GET .../results/<call id>``) and L1 keeps a pointer, so one big tool output can no longer
make the session's state too big to send.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.execution import endpoint
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import EventRequest, StateResponse, ToolCallEvent, WireState
from context_app.service.owners import Lease
from context_app.service.routes._common import (
    EVENT_ERRORS,
    PathSessionId,
    agent_auth,
    opened_for,
    resource_router,
    state_response,
    wire_out,
)
from context_core.access.compliance import EffectiveProfile, snapshot_op
from context_core.errors import PayloadTooLargeError
from context_core.redis.ops import Op
from context_core.session.state import OffloadedPayload, SessionState, TraceOffload

__all__ = ["router"]

router = resource_router()


@router.post(
    "/v1/sessions/{session_id}/events",
    tags=["sessions"],
    response_model=StateResponse,
    responses=EVENT_ERRORS,
)
@endpoint
def post_event(
    session_id: PathSessionId, body: EventRequest, svc: Svc, who: Who, nbytes: BodyBytes
) -> Response:
    """A lifecycle event (tool_call, user_message, user_correction, context_overflow,
    session_timeout, goal_achieved, error_recovery, recovery_complete); everything stored
    passes the gateway. The platform adds its own triggers: a user_message that
    contradicts the task contract is applied as a correction, and a trace over
    ``CTX_L1_MAX_TRACE_TOKENS`` evicts its oldest pairs (``info.overflow``). The returned
    state is the session's new latest; the one sent is stale from then on."""
    wire = opened_for(svc, body.state, session_id, who)
    ev = body.event
    if isinstance(ev, ToolCallEvent):
        _require_result(ev)
    lease, snapshot = _charge_and_reserve(
        svc, who.agent_id, nbytes, session_id, wire, snapshot=isinstance(ev, ToolCallEvent)
    )
    try:
        # the event's L2 writes go to Redis together, in one round trip when the scope
        # ends (or with the next read); the new state is committed only after them
        with svc.wm.deferred():
            offload = _offload(svc, session_id)
            state = wire.to_state(gateway=svc.gateway, auth=agent_auth(who), offload=offload)
            if isinstance(ev, ToolCallEvent):
                done = _tool_call(svc, state, ev, offload, who.org, snapshot)
                result, effects = done["result"], done["effects"]
            else:
                payload = ev.model_dump(exclude={"type"}, exclude_none=True)
                if ev.type == "goal_achieved":  # answers checked against the org's profile
                    payload["org_id"] = who.org
                result = svc.lifecycle.apply(ev.type, state, **payload)
                effects = result.effects
            out = wire_out(svc, result.state, lease.version + 1, lease.nonce, who.org)
        svc.owners.commit(lease, out.stored.decode())
    except BaseException:
        svc.owners.abort(lease)
        raise
    return state_response(out, {"event": ev.type, **effects})


def _offload(svc: Services, session_id: str) -> TraceOffload:
    sm = svc.wm.session(session_id)
    cap = svc.settings.max_body_bytes

    def store(ident: str, value: Any) -> str:
        return str(sm.put_call_result(ident, value, max_bytes=cap))

    return TraceOffload(max_bytes=svc.settings.l1_max_result_bytes, store=store)


def _tool_call(
    svc: Services,
    state: SessionState,
    ev: ToolCallEvent,
    offload: TraceOffload,
    org_id: str,
    snapshot: EffectiveProfile | None = None,
) -> dict[str, Any]:
    """Apply a tool call; the step result is written here, not by the lifecycle, so a result
    too big for a step (``CTX_MAX_STEP_RESULT_BYTES``) can point at the call's L2 copy. A
    tool outside the session's compliance ``approved_tools`` is refused first (403).
    ``snapshot``: the session's compliance snapshot, read with the access check."""
    payload = ev.model_dump(exclude={"type", "result", "store_step"}, exclude_none=True)
    result = svc.lifecycle.apply(
        "tool_call",
        state,
        result=ev.result,
        store_step=False,
        org_id=org_id,
        snapshot=snapshot,
        **payload,
    )
    effects = dict(result.effects)
    if ev.store_step:
        sm = svc.wm.session(state.session_id)
        raw = ev.result
        fields = dict(raw) if isinstance(raw, Mapping) and raw else {"result": raw}
        fields = {str(k): v for k, v in fields.items() if not str(k).startswith("_")}
        fields.setdefault("tool", ev.name)
        step_id = str(state.current_step)
        ref = offload.stored.get(str(effects["call_id"]))
        if ref is not None and ref.bytes > sm.wm.max_step_bytes:  # the whole would not fit
            effects["step_key"] = sm.put_step_result(step_id, _step_pointer(ev, ref))
        else:
            try:
                effects["step_key"] = sm.put_step_result(step_id, fields)
            except PayloadTooLargeError:
                if ref is None:  # in L2 nowhere else: the client must send less
                    raise
                effects["step_key"] = sm.put_step_result(step_id, _step_pointer(ev, ref))
    return {"result": result, "effects": effects}


def _step_pointer(ev: ToolCallEvent, ref: OffloadedPayload) -> dict[str, Any]:
    """The step result of a call whose result lives in L2 as ``result:<call id>``."""
    return {
        "tool": ev.name,
        "status": ev.status,
        "result_ref": ref.l2_key,
        "result_sha256": ref.sha256,
        "result_bytes": ref.bytes,
    }


def _require_result(ev: ToolCallEvent) -> None:
    """A tool call must say what the tool returned (checked after the model's own checks,
    so a request with other errors reports those first)."""
    if "result" not in ev.model_fields_set:
        raise RequestValidationError(
            [
                {
                    "type": "missing",
                    "loc": ("body", "event", "tool_call", "result"),
                    "msg": "Field required: the tool's result (send null for none)",
                }
            ]
        )


def _charge_and_reserve(
    svc: Services,
    agent_id: str,
    nbytes: int,
    session_id: str,
    wire: WireState,
    *,
    snapshot: bool = False,
) -> tuple[Lease, EffectiveProfile | None]:
    """An event's quota charge and write lease in one round trip, with the session's
    compliance snapshot when ``snapshot`` (a tool call checks it; read speculatively, used
    only once the lease is held). A refused quota wins (it is checked first, as before): a
    lease taken meanwhile is given back."""
    ops: list[Op[object]] = [
        svc.quotas.charge_op(agent_id, nbytes, session_id=session_id),
        svc.owners.reserve_op(session_id, agent_id, wire.nonce, wire.version),
    ]
    if snapshot:
        ops.append(snapshot_op(svc.wm.session(session_id)))
    charged, lease, *snap = svc.run(
        ops, "checking quotas and the session owner", return_exceptions=True
    )
    if isinstance(charged, BaseException):
        if isinstance(lease, Lease):
            svc.owners.abort(lease)
        raise charged
    if isinstance(lease, BaseException):
        raise lease
    assert isinstance(lease, Lease)
    found = snap[0] if snap and isinstance(snap[0], EffectiveProfile) else None
    return lease, found
