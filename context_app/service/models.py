"""Request/response models of the HTTP API, and the signed wire form of L1 session state.

The service is stateless: the agent's L1 state travels in each request and comes back
updated. It is signed (HMAC-SHA256, key shared by every instance through Redis), so a client
can carry its state but not forge or edit it; rebuilding a :class:`SessionState` from the wire
runs every field through the gateway again. The signature also covers ``version`` (+1 per
applied event) and ``nonce`` (drawn when the session id is created), which the service checks
against Redis, so a replayed or superseded state, or one from an earlier incarnation of the
session, is refused (see :mod:`context_app.service.owners`).

Every request field has limits: ids match ``[A-Za-z0-9._-]`` (what L2 keys accept), texts
have lengths and no lone surrogates, free-form JSON (tool args/results, contract fields,
``api_params`` ...) is bounded in depth, items and string length (:mod:`.limits`), and the
``params`` of ``/v1/context`` are typed. A violation is a 422 naming the field and the limit.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, FiniteFloat, model_validator
from pydantic_core import PydanticCustomError

from context_app.service.limits import check_json, check_text, check_unicode
from context_core.gateway import Gateway
from context_core.session import (
    ApiResultPointer,
    AuthContext,
    SessionState,
    TraceItem,
    TraceOffload,
)

__all__ = [
    "ID_PATTERN",
    "CloseResponse",
    "ConfirmationRequest",
    "ConfirmationResponse",
    "ContextParams",
    "ContextRequest",
    "ContextResponse",
    "ContractResponse",
    "CreateSessionRequest",
    "Event",
    "EventRequest",
    "FragmentOut",
    "OutputRequest",
    "PlanRequest",
    "PlanResponse",
    "PreferenceIn",
    "PreferenceOut",
    "PreferencesResponse",
    "StateResponse",
    "WireState",
    "state_from_wire",
    "state_to_wire",
    "state_to_wire_dict",
    "verify_wire",
]

ID_PATTERN = r"^[A-Za-z0-9._-]+$"
"""Session and call ids: the characters an L2 key segment may hold (no colon or brace)."""

SessionId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
CallId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
Nonce = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
NO_NONCE = "0" * 32


Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_text)]
ShortText = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(check_text)]
Query = Annotated[str, Field(max_length=8000), AfterValidator(check_text)]
AnswerText = Annotated[str, Field(min_length=1, max_length=8000), AfterValidator(check_text)]
Intent = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(check_text)]
Output = Annotated[str, Field(max_length=64_000), AfterValidator(check_text)]
WireId = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(check_unicode)]
WireName = Annotated[str, Field(max_length=1000), AfterValidator(check_unicode)]
WireText = Annotated[str, Field(max_length=256 * 1024), AfterValidator(check_unicode)]
JsonValue = Annotated[Any, AfterValidator(check_json)]
"""Free-form JSON, bounded by :func:`~context_app.service.limits.check_json`."""
JsonObject = Annotated[dict[str, Any], AfterValidator(check_json)]
"""A free-form JSON object (a list or a string is a 422 naming the field)."""


def _scalar(v: Any) -> Any:
    if isinstance(v, str):
        if len(v) > 8000:
            raise PydanticCustomError(
                "string_too_long",
                "String should have at most 8000 characters",
                {"max_length": 8000},
            )
        return check_text(v)
    if v is None or isinstance(v, int | float):
        return v
    raise PydanticCustomError(
        "scalar_type", "expected a string, number, boolean or null", {"expected": "scalar"}
    )


Scalar = Annotated[Any, AfterValidator(_scalar)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WireApiResult(_Model):
    status: WireName
    data_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class WireTraceItem(_Model):
    kind: Literal["tool_call", "tool_result"]
    name: WireName
    payload: WireText
    ts: float
    call_id: CallId
    status: WireName | None = None


class WireState(_Model):
    """L1 as JSON. ``sig`` covers every other field; the auth context never travels.

    Its texts were cleaned by the gateway (which may lengthen them a little, e.g. a masked
    secret), so their limits are looser than the request fields they came from."""

    session_id: SessionId
    user_id: WireId
    start_time: float
    user_query: WireText
    current_step: int = Field(ge=0)
    last_device_id: WireName | None = None
    last_api_result: WireApiResult | None = None
    trace: list[WireTraceItem] = Field(default_factory=list, max_length=20)
    version: int = Field(0, ge=0, description="+1 per applied event; stale versions are refused")
    nonce: Nonce = Field(NO_NONCE, description="the session's incarnation")
    sig: str = Field(min_length=64, max_length=64)

    def signed_part(self) -> dict[str, Any]:
        return self.model_dump(exclude={"sig"})


def _signature(key: bytes, body: dict[str, Any]) -> str:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, canon.encode("utf-8"), hashlib.sha256).hexdigest()


def state_to_wire_dict(
    state: SessionState, key: bytes, *, version: int = 0, nonce: str = NO_NONCE
) -> dict[str, Any]:
    """The signed wire form as a plain dict, ready to JSON-encode into a response.

    ``version``/``nonce`` come from the session's record in Redis (:mod:`.owners`); the
    defaults are for states that never meet the service's replay check (tests, tools).

    One validation pass (limits and type coercion, e.g. an int ``start_time`` becomes a float)
    gives exactly the dict a client's echo parses back to, so the signature is over the same
    canonical bytes :func:`verify_wire` recomputes.
    """
    body: dict[str, Any] = {
        "session_id": state.session_id,
        "user_id": state.user_id,
        "start_time": state.start_time,
        "user_query": state.user_query,
        "current_step": state.current_step,
        "last_device_id": state.last_device_id,
        "last_api_result": (
            None
            if state.last_api_result is None
            else {
                "status": state.last_api_result.status,
                "data_sha256": state.last_api_result.data_sha256,
            }
        ),
        "trace": [
            {
                "kind": t.kind,
                "name": t.name,
                "payload": t.payload,
                "ts": t.ts,
                "call_id": t.call_id,
                "status": t.status,
            }
            for t in state.trace
        ],
        "version": version,
        "nonce": nonce,
    }
    unsigned = WireState.model_validate({**body, "sig": "0" * 64}).signed_part()
    unsigned["sig"] = _signature(key, unsigned)
    return unsigned


def state_to_wire(
    state: SessionState, key: bytes, *, version: int = 0, nonce: str = NO_NONCE
) -> WireState:
    """The signed wire form as a model (same bytes as :func:`state_to_wire_dict`)."""
    return WireState.model_validate(state_to_wire_dict(state, key, version=version, nonce=nonce))


def verify_wire(wire: WireState, key: bytes) -> bool:
    return hmac.compare_digest(wire.sig, _signature(key, wire.signed_part()))


def state_from_wire(
    wire: WireState,
    *,
    gateway: Gateway,
    auth: AuthContext,
    offload: TraceOffload | None = None,
) -> SessionState:
    """Rebuild L1 (untrusted construction: the gateway cleans every field again).
    ``offload`` sends big trace payloads of later tool calls to L2 (see :mod:`..session`)."""
    ptr = wire.last_api_result
    return SessionState(
        session_id=wire.session_id,
        user_id=wire.user_id,
        start_time=wire.start_time,
        user_query=wire.user_query,
        current_step=wire.current_step,
        last_device_id=wire.last_device_id,
        last_api_result=None if ptr is None else ApiResultPointer(ptr.status, ptr.data_sha256),
        trace=tuple(
            TraceItem(t.kind, t.name, t.payload, t.ts, t.call_id, t.status) for t in wire.trace
        ),
        gateway=gateway,
        auth_context=auth,
        offload=offload,
    )


# --- requests --------------------------------------------------------------------------------


class CreateSessionRequest(_Model):
    user_id: ShortText
    user_query: Query
    session_id: SessionId | None = Field(None, description="default: a fresh random id")
    device_id: ShortText | None = None
    contract: JsonObject = Field(
        default_factory=dict,
        max_length=100,
        description="initial task-contract fields besides the goal",
    )


class ToolCallEvent(_Model):
    """A finished tool call: L1 gets the call/result pair (step advances unless told not to);
    L2 gets the cleaned, capped response (api key), the step result and any series points."""

    type: Literal["tool_call"]
    name: Name = Field(description="tool / endpoint name")
    args: JsonObject = Field(default_factory=dict)
    result: JsonValue = Field(
        None, description="the tool's result: required (null allowed, absent is a 422)"
    )
    status: Literal["ok", "error", "timeout"] = "ok"
    call_id: CallId | None = None
    store_step: bool = True
    advance: bool = True
    device_id: ShortText | None = None
    series: (
        dict[
            Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\s{}:*?\[\]\\]+$")],
            Annotated[list[tuple[FiniteFloat, FiniteFloat]], Field(max_length=10_000)],
        ]
        | None
    ) = Field(
        None,
        max_length=100,
        description='e.g. {"PUMP-0042.vibration": [[ts, value], ...]}',
    )


class UserCorrectionEvent(_Model):
    type: Literal["user_correction"]
    fields: JsonObject = Field(
        min_length=1, max_length=100, description="corrected task-contract fields"
    )
    user_query: Query | None = None


class ContextOverflowEvent(_Model):
    type: Literal["context_overflow"]
    keep_pairs: int | None = Field(None, ge=0, le=10)
    low_priority_ttl_s: int | None = Field(None, gt=0, le=86_400)


class SessionTimeoutEvent(_Model):
    type: Literal["session_timeout"]


class Answer(BaseModel):
    """A confirmed answer for hot knowledge; other fields pass through as JSON."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue]

    text: AnswerText
    source: Name | None = None
    section: Name | None = None
    title: Name | None = None
    namespace: Name | None = None


class GoalAchievedEvent(_Model):
    type: Literal["goal_achieved"]
    answers: list[Answer] = Field(
        default_factory=list,
        max_length=50,
        description="confirmed answers for hot knowledge: {text, ...}",
    )
    grace_s: int | None = Field(None, gt=0, le=86_400)


class ErrorRecoveryEvent(_Model):
    type: Literal["error_recovery"]


class UserMessageEvent(_Model):
    """What the user said. The platform checks it against the task contract: a negation plus
    a value that contradicts the contract, with enough confidence, is applied as a
    ``user_correction`` (the detection is reported in ``info.correction`` either way)."""

    type: Literal["user_message"]
    text: AnswerText


class RecoveryCompleteEvent(_Model):
    """The agent recovered from the error: the contract locked by ``error_recovery`` is
    unlocked (writes to it are 423 ``contract_locked`` until then)."""

    type: Literal["recovery_complete"]


Event = Annotated[
    ToolCallEvent
    | UserCorrectionEvent
    | ContextOverflowEvent
    | SessionTimeoutEvent
    | GoalAchievedEvent
    | ErrorRecoveryEvent
    | UserMessageEvent
    | RecoveryCompleteEvent,
    Field(discriminator="type"),
]


class EventRequest(_Model):
    state: WireState
    event: Event


class ContextParams(BaseModel):
    """Template values of ``/v1/context``; names the intents use are typed, any other name
    may carry a scalar (string, number, boolean, null)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Scalar]

    device: ShortText | None = None
    section: Name | None = None
    query: Query | None = None
    endpoint: Name | None = None
    api_params: JsonObject | None = Field(
        None, description="the tool call's args, to find its cached response (an object)"
    )

    @model_validator(mode="before")
    @classmethod
    def _few(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > 64:
            raise ValueError(f"at most 64 params, got {len(data)}")
        return data


class ContextRequest(_Model):
    session_id: SessionId
    step_intent: Intent
    state: WireState
    params: ContextParams = Field(default_factory=lambda: ContextParams.model_validate({}))


class OutputRequest(_Model):
    """The step's output, appended to the trace file for CER (under the bundle's step)."""

    state: WireState
    trace_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    output: Output
    step: int | None = Field(None, ge=0, description="default: the state's current step")


StepId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]


class PlanStep(_Model):
    step_id: StepId
    depends_on: list[StepId] = Field(
        default_factory=list, max_length=100, description="steps whose outputs this one reads"
    )
    est_start_s: FiniteFloat = Field(
        0.0, ge=0, le=7 * 86_400, description="expected start, seconds from now"
    )


class PlanRequest(_Model):
    """The agent's step dependency graph. A step's output lives until the latest step that
    reads it is expected to start, times ``factor``, and at least ``CTX_WM_MIN_TTL_S``."""

    steps: list[PlanStep] = Field(min_length=1, max_length=500)
    factor: FiniteFloat = Field(2.0, ge=1.0, le=10.0, description="safety factor (plans slip)")

    @model_validator(mode="after")
    def _graph(self) -> PlanRequest:
        ids = [s.step_id for s in self.steps]
        seen: set[str] = set()
        for i, sid in enumerate(ids):
            if sid in seen:
                raise PydanticCustomError(
                    "duplicate_step",
                    "steps[{index}].step_id {step!r} appears twice",
                    {"index": i, "step": sid},
                )
            seen.add(sid)
        for i, s in enumerate(self.steps):
            unknown = [d for d in s.depends_on if d not in seen]
            if unknown:
                raise PydanticCustomError(
                    "unknown_step",
                    "steps[{index}].depends_on names unknown step(s) {unknown}; allowed: "
                    "the step_ids of this plan",
                    {"index": i, "unknown": ", ".join(unknown)},
                )
        return self


class ConfirmationRequest(_Model):
    """Answers the user confirmed (e.g. after a fallback: no L3 match for something the user
    taught earlier). They go to hot knowledge now, trust-scoped like goal_achieved's."""

    state: WireState
    answers: list[Answer] = Field(min_length=1, max_length=50)


class PreferenceIn(_Model):
    value: JsonValue
    confidence: float = Field(1.0, ge=0.0, le=1.0)


PrefType = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_]{0,31}$")]


# --- responses -------------------------------------------------------------------------------


class StateResponse(_Model):
    state: WireState
    info: dict[str, Any] = Field(default_factory=dict)


class FragmentOut(_Model):
    layer: str
    source: str
    content: Any
    relevance: float
    freshness_hours: float
    confidence: float
    label: str
    note: str = ""


class ContextResponse(_Model):
    session_id: str
    step: int
    intent: str
    fragments: list[FragmentOut]
    degraded: bool
    timings_ms: dict[str, float]
    context_used: dict[str, Any]
    trace_id: str


class ToolResultResponse(_Model):
    session_id: str
    call_id: str
    key: str
    data: Any
    stored_at: float
    ttl_s: float | None


class CloseResponse(_Model):
    session_id: str
    deleted_keys: int


class PlanResponse(_Model):
    session_id: str
    ttls: dict[str, int] = Field(description="TTL now set on each existing step output")
    plan: dict[str, Any] = Field(description="the stored plan, start times relative to now")


class ConfirmationResponse(_Model):
    session_id: str
    confirmed: list[dict[str, str]] = Field(description="hot point id and trust scope each")


class PreferenceOut(_Model):
    value: Any
    confidence: float
    last_updated: float


class PreferencesResponse(_Model):
    session_id: str
    preferences: dict[str, PreferenceOut]


class ContractResponse(_Model):
    session_id: str
    version: int
    fields: dict[str, Any]
    corrected: bool
    locked: bool
    status: str = Field("active", description="active, expired (timed out) or completed")
    ttl_s: float | None = None
    sha256: str
