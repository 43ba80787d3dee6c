"""The session and context endpoints.

Endpoints are plain ``def``: the memory layers are synchronous clients, so FastAPI runs them
in its worker threads. The hot endpoints return JSON encoded once by the library's encoder
(:func:`context_core.session.wire.encode_json`) from the library's own wire models (the bundle,
the signed state), with no second validation pass; ``response_model`` on the route publishes
the same models in OpenAPI, and tests/test_openapi_contract.py checks the bytes against it.

Per request, one script in Redis checks that the session is the caller's and that the signed
state is its latest (:mod:`.owners`): another agent's session answers exactly like a missing
one (404), an old or replayed state is 409 ``stale_state``. An event holds the session's write
lease while it runs and commits the new version at the end; if anything fails, including a
new state over ``CTX_L1_MAX_STATE_BYTES`` (413), nothing is committed and the state the client
sent stays the latest. Tool args/results over ``CTX_L1_MAX_RESULT_BYTES`` go to L2
(``wm:{<sid>}:result:<call id>``, readable with ``GET .../results/<call id>``) and L1 keeps a
pointer, so one big tool output can no longer make the session's state too big to send.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from context_app.service.cpu_budget import run_sanitizer
from context_app.service.deps import Services
from context_app.service.errors_map import json_response
from context_app.service.execution import endpoint
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import (
    ID_PATTERN,
    SESSION_ERRORS,
    CloseResponse,
    ContextDeltaResponse,
    ContextRequest,
    ContextResponse,
    ContractHistoryResponse,
    ContractResponse,
    ContractUnchangedResponse,
    ContractUpdateRequest,
    CreateSessionRequest,
    ErrorResponse,
    EventRequest,
    OutputRequest,
    OutputResponse,
    StateResponse,
    ToolCallEvent,
    ToolResultResponse,
    WireState,
    error_responses,
)
from context_app.service.owners import Lease
from context_core.access.compliance import EffectiveProfile, snapshot_op
from context_core.access.identity import canonical_user_id
from context_core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    ContextMissError,
    PayloadTooLargeError,
    StaleStateError,
    StateTooLargeError,
    UnknownSessionError,
)
from context_core.redis.connection import REDIS_ERRORS
from context_core.redis.ops import Cmd, Op, ok
from context_core.session.state import AuthContext, OffloadedPayload, SessionState, TraceOffload
from context_core.session.wire import encode_json
from context_core.working_memory.contract_sync import contract_since

__all__ = ["install_session_routes"]

PathSessionId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN)]
PathCallId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN)]
SinceVersion = Annotated[
    int | None,
    Query(
        ge=0,
        description="the contract version the caller holds: while the contract is still at "
        'it, the answer is {"session_id", "version", "changed": false} (one HGET in Redis); '
        "any other version answers the contract in full",
    ),
]

ERRORS = error_responses(*SESSION_ERRORS)
EVENT_ERRORS = error_responses(*SESSION_ERRORS, 423)


def _auth(who: Any) -> AuthContext:
    return AuthContext(agent_id=who.agent_id, scopes=tuple(who.purposes), org=who.org)


def _signed_for(svc: Services, wire: WireState, session_id: str) -> None:
    """The state names this session and carries the service's signature."""
    if wire.session_id != session_id:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("body", "state", "session_id"),
                    "msg": f"state belongs to session {wire.session_id!r}, not {session_id!r}",
                }
            ]
        )
    if not wire.verify(svc.state_key):
        raise AccessDeniedError(
            "state signature does not match: send the state exactly as the service returned it"
        )


def wire_response(payload: Any, status_code: int = 200) -> Response:
    """``payload`` encoded once by the wire encoder (FastAPI's forgiving one for a value it
    cannot hold)."""
    try:
        body = encode_json(payload)
    except TypeError:
        return json_response(payload, status_code)
    return Response(body, status_code=status_code, media_type="application/json")


def state_response(state_json: bytes, info: Any, status_code: int = 200) -> Response:
    """``{"state": ..., "info": ...}`` around a state already encoded (it is not encoded
    twice); ``info`` passes FastAPI's encoder first (effects may hold any value)."""
    try:
        info_json = encode_json(info if _plain_json(info) else jsonable_encoder(info))
    except TypeError:
        return json_response({"state": json.loads(state_json), "info": info}, status_code)
    body = b'{"state":' + state_json + b',"info":' + info_json + b"}"
    return Response(body, status_code=status_code, media_type="application/json")


_PLAIN = (str, int, float, bool, type(None))


def _plain_json(value: Any, depth: int = 0) -> bool:
    """Only JSON's own types (exact types: no enum, no subclass), so FastAPI's encoder would
    hand it back as it is and the wire encoder can take it directly."""
    t = type(value)
    if t in _PLAIN:
        return True
    if depth > 32:
        return False
    if t is dict:
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())
    if t is list or t is tuple:
        return all(_plain_json(v, depth + 1) for v in value)
    return False


def _wire_out(svc: Services, state: SessionState, version: int, nonce: str) -> bytes:
    """The signed state's JSON; refused (413) when over ``CTX_L1_MAX_STATE_BYTES``."""
    text = encode_json(WireState.of(state, svc.state_key, version=version, nonce=nonce))
    size, cap = len(text), svc.settings.l1_max_state_bytes
    if size > cap:
        raise StateTooLargeError(
            f"this event would make the session's L1 state {size} bytes, over the {cap}-byte "
            "limit (CTX_L1_MAX_STATE_BYTES); nothing was applied to L1 and the state you sent "
            "is still valid: trim the trace with a context_overflow event (keep_pairs) or "
            "send shorter texts, then retry",
            limit_bytes=cap,
        )
    return text


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


def _contract_out(session_id: str, c: Any, ttl_s: float | None = None) -> ContractResponse:
    canon = json.dumps(
        {"version": c.version, "fields": c.fields}, sort_keys=True, separators=(",", ":")
    )
    return ContractResponse(
        session_id=session_id,
        version=c.version,
        fields=c.fields,
        corrected=c.corrected,
        locked=c.locked,
        status=c.status,
        ttl_s=ttl_s,
        sha256=hashlib.sha256(canon.encode()).hexdigest(),
    )


def install_session_routes(app: FastAPI) -> None:
    @app.post(
        "/v1/sessions",
        status_code=201,
        tags=["sessions"],
        response_model=StateResponse,
        responses=ERRORS,
    )
    @endpoint
    def create_session(
        body: CreateSessionRequest, svc: Svc, who: Who, nbytes: BodyBytes
    ) -> Response:
        """Start a session owned by the calling agent; returns the signed L1 state. The user
        id is kept in canonical form (NFKC, trimmed, case-folded; 422 ``invalid_id`` naming the
        rule for ids with invisible characters or look-alike script mixes); it names a user
        of the calling agent's organisation. An id that cannot be taken answers 409
        ``session_id_unavailable``, whatever the reason."""
        canonical_user_id(body.user_id)  # refused before anything is claimed
        sid = body.session_id or f"s-{uuid.uuid4().hex}"
        nonce = svc.owners.claim(sid, who.agent_id)
        try:
            svc.quotas.charge(who.agent_id, nbytes, session_id=sid, new_session=True)
        except BaseException:
            svc.owners.release(sid)
            raise
        try:
            # the start's fire-and-forget writes (snapshot, activity, the published state)
            # share round trips with its reads (see WorkingMemory.deferred)
            with svc.wm.deferred():
                result = svc.lifecycle.apply(
                    "session_start",
                    None,
                    session_id=sid,
                    user_id=body.user_id,
                    user_query=body.user_query,
                    auth=_auth(who),
                    contract=body.contract,
                    device_id=body.device_id,
                    org_id=who.org,  # the compliance profile snapshot: the agent key's org
                )
                text = _wire_out(svc, result.state, 0, nonce)
                svc.wm.defer(svc.owners.publish_cmd(sid, text.decode()))
        except BaseException:
            _undo_create(svc, sid, who.agent_id)
            raise
        return state_response(text, result.effects, 201)

    @app.post(
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
        wire = body.state
        _signed_for(svc, wire, session_id)
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
                state = wire.to_state(gateway=svc.gateway, auth=_auth(who), offload=offload)
                if isinstance(ev, ToolCallEvent):
                    done = _tool_call(svc, state, ev, offload, who.org, snapshot)
                    result, effects = done["result"], done["effects"]
                else:
                    payload = ev.model_dump(exclude={"type"}, exclude_none=True)
                    if ev.type == "goal_achieved":  # answers checked against the org's profile
                        payload["org_id"] = who.org
                    result = svc.lifecycle.apply(ev.type, state, **payload)
                    effects = result.effects
                text = _wire_out(svc, result.state, lease.version + 1, lease.nonce)
            svc.owners.commit(lease, text.decode())
        except BaseException:
            svc.owners.abort(lease)
            raise
        return state_response(text, {"event": ev.type, **effects})

    @app.post(
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
        allowed = svc.intents()
        if body.step_intent not in allowed:
            raise RequestValidationError(
                [
                    {
                        "type": "unknown_intent",
                        "loc": ("body", "step_intent"),
                        "msg": f"unknown step_intent {body.step_intent!r}",
                        "ctx": {"allowed": allowed},
                    }
                ]
            )
        m = svc.metrics
        try:
            wire = body.state
            _signed_for(svc, wire, body.session_id)
            state = wire.to_state(gateway=svc.gateway, auth=_auth(who))
            gauge = getattr(request.app.state, "load", None)
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
        spec = svc.registry.get(body.step_intent)
        m.observe_bundle(bundle.timings_ms, l3_requested=bool(spec.l3) and skip is None)
        if bundle.degraded:
            m.degraded.inc()
        misses = len(bundle.l2_missing)  # optional keys the step went without
        if misses > 0:
            m.l2_misses.inc(misses)
        return wire_response(bundle.to_delta_dict() if body.delta else bundle.to_dict())

    @app.post(
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
        wire = body.state
        _signed_for(svc, wire, session_id)
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
        clean = run_sanitizer(  # off the event loop, within CTX_OUTPUT_SANITIZE_BUDGET_MS
            body.output,
            gateway=svc.gateway,
            fmt=body.format,
            where=f"output:{session_id}:{body.trace_id}",
            budget_ms=svc.settings.output_sanitize_budget_ms,
        )
        svc.tracer.record_output(body.trace_id, session_id, step, clean.text)
        info = {"step": step, "trace_id": body.trace_id}
        removed = [r.to_dict() for r in clean.removed]
        payload = b'{"state":%b,"info":%b,"output":%b,"removed":%b}' % (
            encode_json(wire),
            encode_json(info),
            encode_json(clean.text),
            encode_json(removed),
        )
        return Response(payload, media_type="application/json")

    @app.get(
        "/v1/sessions/{session_id}/state",
        tags=["sessions"],
        response_model=StateResponse,
        responses=ERRORS,
    )
    def get_state(session_id: PathSessionId, svc: Svc, who: Who) -> Response:
        """The session's latest signed state: where a client answered ``stale_state`` (or one
        that lost a response) picks up again."""
        latest = json.loads(svc.owners.latest_state(session_id, who.agent_id))
        return wire_response({"state": latest, "info": {"version": latest.get("version", 0)}})

    @app.get(
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

    @app.get(
        "/v1/sessions/{session_id}/contract",
        tags=["sessions"],
        response_model=ContractResponse | ContractUnchangedResponse,
        responses=ERRORS,
    )
    def get_contract(
        session_id: PathSessionId, svc: Svc, who: Who, since_version: SinceVersion = None
    ) -> Response:
        """The current task contract with a content hash (used to check nothing was lost), its
        status (active, expired after a timeout, completed) and the seconds it has left.

        With ``?since_version=N`` (polling agents): while the contract is still at version
        ``N`` the answer is 200 ``{"session_id", "version": N, "changed": false}``, read with
        one ``HGET`` of the version (besides the ownership check); otherwise the contract in
        full, as without the parameter."""
        svc.owners.check(session_id, who.agent_id)
        sm = svc.wm.session(session_id)
        if since_version is None:
            contract = sm.contract()
        else:
            found = contract_since(sm, since_version)
            if found is None:
                return wire_response(
                    ContractUnchangedResponse(
                        session_id=session_id, version=since_version, changed=False
                    )
                )
            contract = found
        ttl: float | None = None
        if contract.version:
            with contextlib.suppress(ContextMissError):
                ttl = sm.ttl(sm.key("contract", "current"))
        return wire_response(_contract_out(session_id, contract, ttl))

    @app.put(
        "/v1/sessions/{session_id}/contract",
        tags=["sessions"],
        response_model=ContractResponse,
        responses={
            **EVENT_ERRORS,
            409: {
                "model": ErrorResponse,
                "description": "version_conflict: the write was based on a stale version "
                "(the body names current_version and expected_version); nothing was written",
            },
        },
    )
    def put_contract(
        session_id: PathSessionId,
        body: ContractUpdateRequest,
        svc: Svc,
        who: Who,
        nbytes: BodyBytes,
    ) -> Response:
        """Write a new contract version based on ``expected_version`` (optimistic lock):
        the fields are merged in (cleaned by the gateway) and the new version is answered.
        A stale ``expected_version`` is 409 ``version_conflict`` naming ``current_version``
        (re-read, redo the change, retry); a locked contract (error recovery) is 423."""
        svc.owners.check(session_id, who.agent_id)
        svc.quotas.charge(who.agent_id, nbytes, session_id=session_id)
        sm = svc.wm.session(session_id)
        contract = sm.update_contract(
            body.fields, expected_version=body.expected_version, corrected=body.corrected
        )
        sm.touch()
        return wire_response(_contract_out(session_id, contract, float(sm.wm.contract_ttl_s)))

    @app.get(
        "/v1/sessions/{session_id}/contract/history",
        tags=["sessions"],
        response_model=ContractHistoryResponse,
        responses=ERRORS,
    )
    def get_contract_history(
        session_id: PathSessionId, svc: Svc, who: Who
    ) -> ContractHistoryResponse:
        """Every version of the task contract, oldest first (kept for audit for
        ``CTX_WM_CONTRACT_HISTORY_TTL_S`` after its last write, 30 days by default)."""
        svc.owners.check(session_id, who.agent_id)
        history = svc.wm.session(session_id).contract_history()
        return ContractHistoryResponse(
            session_id=session_id, versions=[_contract_out(session_id, c) for c in history]
        )

    @app.delete(
        "/v1/sessions/{session_id}",
        tags=["sessions"],
        response_model=CloseResponse,
        responses=ERRORS,
    )
    @endpoint
    def close_session(session_id: PathSessionId, svc: Svc, who: Who) -> Response:
        """Close the session: its working memory is deleted now rather than left to expire;
        its states are void (a session created again under the id starts a new incarnation)."""
        svc.owners.check(session_id, who.agent_id)
        n = svc.wm.session(session_id).clear()
        svc.run(  # what is left of the session, in one round trip
            [
                _sent(
                    [
                        *svc.wm.forget_activity_cmds(session_id),
                        *svc.owners.release_cmds(session_id, who.agent_id),
                        *svc.quotas.forget_cmds(who.agent_id, session_id),
                    ]
                )
            ],
            "closing the session",
        )
        return wire_response({"session_id": session_id, "deleted_keys": n})


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


def _sent(cmds: list[Cmd]) -> Op[None]:
    """Operation: send ``cmds`` and raise the first error reply."""
    ok((yield cmds))


def _undo_create(svc: Services, session_id: str, agent_id: str) -> None:
    """A creation failed after the claim: drop what it wrote, then free the id."""
    for undo in (
        lambda: svc.wm.session(session_id).clear(),
        lambda: svc.owners.release(session_id),
        lambda: svc.quotas.forget(agent_id, session_id),
    ):
        with contextlib.suppress(Exception):  # the client must hear the original error
            undo()
