"""Request/response models of the HTTP API, and the signed wire form of L1 session state.

The service is stateless: the agent's L1 state travels in each request and comes back
updated. It is signed (HMAC-SHA256, key shared by every instance through Redis), so a client
can carry its state but not forge or edit it; rebuilding a :class:`SessionState` from the wire
runs every field through the gateway again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from context_core.gateway import Gateway
from context_core.session import ApiResultPointer, AuthContext, SessionState, TraceItem

__all__ = [
    "CloseResponse",
    "ContextRequest",
    "ContextResponse",
    "ContractResponse",
    "CreateSessionRequest",
    "Event",
    "EventRequest",
    "FragmentOut",
    "OutputRequest",
    "StateResponse",
    "WireState",
    "state_from_wire",
    "state_to_wire",
    "state_to_wire_dict",
    "verify_wire",
]

SessionId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WireApiResult(_Model):
    status: str
    data_sha256: str


class WireTraceItem(_Model):
    kind: Literal["tool_call", "tool_result"]
    name: str
    payload: str
    ts: float
    call_id: str
    status: str | None = None


class WireState(_Model):
    """L1 as JSON. ``sig`` covers every other field; the auth context never travels."""

    session_id: SessionId
    user_id: str = Field(min_length=1, max_length=128)
    start_time: float
    user_query: str = Field(max_length=8000)
    current_step: int = Field(ge=0)
    last_device_id: str | None = Field(None, max_length=128)
    last_api_result: WireApiResult | None = None
    trace: list[WireTraceItem] = Field(default_factory=list, max_length=20)
    sig: str = Field(min_length=64, max_length=64)

    def signed_part(self) -> dict[str, Any]:
        return self.model_dump(exclude={"sig"})


def _signature(key: bytes, body: dict[str, Any]) -> str:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, canon.encode("utf-8"), hashlib.sha256).hexdigest()


def state_to_wire_dict(state: SessionState, key: bytes) -> dict[str, Any]:
    """The signed wire form as a plain dict, ready to JSON-encode into a response.

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
    }
    unsigned = WireState.model_validate({**body, "sig": "0" * 64}).signed_part()
    unsigned["sig"] = _signature(key, unsigned)
    return unsigned


def state_to_wire(state: SessionState, key: bytes) -> WireState:
    """The signed wire form as a model (same bytes as :func:`state_to_wire_dict`)."""
    return WireState.model_validate(state_to_wire_dict(state, key))


def verify_wire(wire: WireState, key: bytes) -> bool:
    return hmac.compare_digest(wire.sig, _signature(key, wire.signed_part()))


def state_from_wire(wire: WireState, *, gateway: Gateway, auth: AuthContext) -> SessionState:
    """Rebuild L1 (untrusted construction: the gateway cleans every field again)."""
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
    )


# --- requests --------------------------------------------------------------------------------


class CreateSessionRequest(_Model):
    user_id: str = Field(min_length=1, max_length=128)
    user_query: str = Field(max_length=8000)
    session_id: SessionId | None = Field(None, description="default: a fresh random id")
    device_id: str | None = Field(None, max_length=128)
    contract: dict[str, Any] = Field(
        default_factory=dict, description="initial task-contract fields besides the goal"
    )


class ToolCallEvent(_Model):
    """A finished tool call: L1 gets the call/result pair (step advances unless told not to);
    L2 gets the cleaned, capped response (api key), the step result and any series points."""

    type: Literal["tool_call"]
    name: str = Field(min_length=1, max_length=200, description="tool / endpoint name")
    args: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    status: Literal["ok", "error", "timeout"] = "ok"
    call_id: str | None = Field(None, min_length=1, max_length=128)
    store_step: bool = True
    advance: bool = True
    device_id: str | None = Field(None, max_length=128)
    series: dict[str, list[tuple[float, float]]] | None = Field(
        None, description='e.g. {"PUMP-0042.vibration": [[ts, value], ...]}'
    )


class UserCorrectionEvent(_Model):
    type: Literal["user_correction"]
    fields: dict[str, Any] = Field(min_length=1, description="corrected task-contract fields")
    user_query: str | None = Field(None, max_length=8000)


class ContextOverflowEvent(_Model):
    type: Literal["context_overflow"]
    keep_pairs: int | None = Field(None, ge=0, le=10)
    low_priority_ttl_s: int | None = Field(None, gt=0)


class SessionTimeoutEvent(_Model):
    type: Literal["session_timeout"]


class GoalAchievedEvent(_Model):
    type: Literal["goal_achieved"]
    answers: list[dict[str, Any]] = Field(
        default_factory=list, description="confirmed answers for hot knowledge: {text, ...}"
    )
    grace_s: int | None = Field(None, gt=0)


class ErrorRecoveryEvent(_Model):
    type: Literal["error_recovery"]


Event = Annotated[
    ToolCallEvent
    | UserCorrectionEvent
    | ContextOverflowEvent
    | SessionTimeoutEvent
    | GoalAchievedEvent
    | ErrorRecoveryEvent,
    Field(discriminator="type"),
]


class EventRequest(_Model):
    state: WireState
    event: Event


class ContextRequest(_Model):
    session_id: SessionId
    step_intent: str = Field(min_length=1, max_length=100)
    state: WireState
    params: dict[str, Any] = Field(default_factory=dict)


class OutputRequest(_Model):
    """The step's output, appended to the trace file for CER (under the bundle's step)."""

    state: WireState
    trace_id: str = Field(min_length=1, max_length=64)
    output: str = Field(max_length=64_000)
    step: int | None = Field(None, ge=0, description="default: the state's current step")


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


class CloseResponse(_Model):
    session_id: str
    deleted_keys: int


class ContractResponse(_Model):
    session_id: str
    version: int
    fields: dict[str, Any]
    corrected: bool
    locked: bool
    sha256: str
