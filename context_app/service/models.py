"""Request/response models of the HTTP API.

The wire forms the library produces are declared once in :mod:`context_core.session.wire` and used
here as they are: L1 state (:class:`WireState`) and the context bundle (``ContextResponse``
is :class:`~context_core.session.wire.BundleWire` under its published name).

The service is stateless: the agent's L1 state travels in each request and comes back
updated. On the wire it is sealed (:mod:`context_core.session.seal`: AES-256-GCM, bound to the
caller's organisation and the session id), one opaque string a client can carry but neither
read, edit nor move to another session or organisation; the answers that carry it also carry
``session`` (:class:`SessionInfo`: id, step, version) in clear. Until
``CTX_STATE_LEGACY_UNTIL`` a request may still send the old signed :class:`WireState` object
(:data:`StateIn`). Rebuilding a :class:`SessionState` from the wire runs every field through
the gateway again. The state holds ``version`` (+1 per applied event) and ``nonce`` (drawn
when the session id is created), which the service checks against Redis, so a replayed or
superseded state, or one from an earlier incarnation of the session, is refused (see
:mod:`context_app.service.owners`).

Every request field has limits: ids match ``[A-Za-z0-9._-]`` (what L2 keys accept), texts
have lengths and no lone surrogates, free-form JSON (tool args/results, contract fields,
``api_params`` ...) is bounded in depth, items and string length (:mod:`.limits`), and the
``params`` of ``/v1/context`` are typed. A violation is a 422 naming the field and the limit.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, FiniteFloat, model_validator
from pydantic_core import PydanticCustomError

from context_app.service.limits import check_json, check_text
from context_core.session.wire import (
    BUNDLE_ID_PATTERN,
    ID_PATTERN,
    BundleDeltaWire,
    BundleWire,
    WireState,
)

__all__ = [
    "ID_PATTERN",
    "SESSION_ERRORS",
    "CloseResponse",
    "ConfirmationRequest",
    "ConfirmationResponse",
    "ContextDeltaResponse",
    "ContextParams",
    "ContextRequest",
    "ContextResponse",
    "ContractHistoryResponse",
    "ContractResponse",
    "ContractUnchangedResponse",
    "ContractUpdateRequest",
    "CreateSessionRequest",
    "ErrorResponse",
    "Event",
    "EventRequest",
    "HealthResponse",
    "IntentOut",
    "OutputRequest",
    "OutputResponse",
    "PlanRequest",
    "PlanResponse",
    "PreferenceDeleted",
    "PreferenceIn",
    "PreferenceOut",
    "PreferenceSet",
    "PreferencesResponse",
    "ReadyResponse",
    "RemovedItem",
    "SessionInfo",
    "StateIn",
    "StateResponse",
    "UnsupportedTypeResponse",
    "UploadRefusedResponse",
    "UploadResponse",
    "ValidationErrorResponse",
    "WireState",
    "error_responses",
]

SessionId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]

SealedState = Annotated[
    str,
    Field(
        description="the sealed L1 state ('ctx1.<key id>.<data>'): opaque, send it back "
        "exactly as the last answer returned it",
        examples=["ctx1.k1.q83vEjRWeJC..."],
    ),
]
StateIn = SealedState | WireState
"""A request's state: the sealed string, or (until CTX_STATE_LEGACY_UNTIL) the old signed
object."""
CallId = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]


Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(check_text)]
ShortText = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(check_text)]
Query = Annotated[str, Field(max_length=8000), AfterValidator(check_text)]
AnswerText = Annotated[str, Field(min_length=1, max_length=8000), AfterValidator(check_text)]
Intent = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(check_text)]
Output = Annotated[str, Field(max_length=64_000), AfterValidator(check_text)]
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
    state: StateIn
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
    state: StateIn
    params: ContextParams = Field(default_factory=lambda: ContextParams.model_validate({}))
    delta: bool = Field(
        False,
        description="answer as a delta (ContextDeltaResponse): fragments the base bundle held "
        "unchanged by reference only; without since_bundle, a full one with a bundle_id",
    )
    since_bundle: str | None = Field(
        None,
        pattern=BUNDLE_ID_PATTERN,
        description="with delta: the bundle_id of an earlier delta answer of this session the "
        "client holds (one of its last 8); unknown or expired answers a full bundle",
    )

    @model_validator(mode="after")
    def _since_needs_delta(self) -> ContextRequest:
        if self.since_bundle is not None and not self.delta:
            raise PydanticCustomError(
                "since_without_delta", "since_bundle is only meaningful with delta: true"
            )
        return self


class OutputRequest(_Model):
    """The step's output, appended to the trace file for CER (under the bundle's step)."""

    state: StateIn
    trace_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    output: Output
    step: int | None = Field(None, ge=0, description="default: the state's current step")
    format: Literal["markdown", "html", "text"] = Field(
        "markdown",
        description="how the output will be rendered: decides which HTML survives (none for "
        "text); links, secrets and PII are cleaned in every format",
    )


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

    state: StateIn
    answers: list[Answer] = Field(min_length=1, max_length=50)


class PreferenceIn(_Model):
    value: JsonValue
    confidence: float = Field(1.0, ge=0.0, le=1.0)


PrefType = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_]{0,31}$")]


# --- responses -------------------------------------------------------------------------------


class SessionInfo(_Model):
    """What a client may read of its sealed state, in clear."""

    session_id: str
    step: int = Field(description="the state's current step")
    version: int = Field(description="the state's version: +1 per applied event")


class StateResponse(_Model):
    state: SealedState
    session: SessionInfo
    info: dict[str, Any] = Field(default_factory=dict)


class RemovedItem(_Model):
    """One thing the output sanitizer took out of an output."""

    kind: str = Field(
        description="scheme, private_host, bad_url, html_tag, html_attr, html_comment, secret, pii"
    )
    value: str = Field(description="what was removed, shortened; secrets show as [REDACTED]")
    detail: str


class OutputResponse(StateResponse):
    """The state (unchanged), the output as stored (sanitized) and what was removed from it."""

    output: str
    removed: list[RemovedItem] = Field(default_factory=list)


class ContextResponse(BundleWire):
    """The step's context bundle (declared once, as
    :class:`context_core.session.wire.BundleWire`)."""


class ContextDeltaResponse(BundleDeltaWire):
    """The step's bundle as a delta (``"delta": true``; :class:`context_core.session.wire.
    BundleDeltaWire`, applied by :func:`context_core.routing.delta.apply_delta`)."""


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


class ContractUnchangedResponse(_Model):
    """``GET .../contract?since_version=N`` while the contract is still at version ``N``
    (read with one ``HGET`` of its version; nothing else is read or sent)."""

    session_id: str
    version: int
    changed: Literal[False] = Field(
        description="always false here; a changed contract is answered in full instead"
    )


ContractFieldName = Annotated[str, Field(min_length=1, max_length=200)]


class ContractUpdateRequest(_Model):
    """``PUT .../contract``: a new version based on the one the agent read."""

    expected_version: int = Field(
        ge=0,
        description="the version this write is based on (the one the agent read); when the "
        "contract has moved on, 409 version_conflict naming current_version, nothing written",
    )
    fields: Annotated[dict[ContractFieldName, Any], AfterValidator(check_json)] = Field(
        min_length=1, max_length=100, description="task-contract fields to merge in"
    )
    corrected: bool = Field(False, description="written because the user corrected the agent")


class ContractHistoryResponse(_Model):
    session_id: str
    versions: list[ContractResponse] = Field(description="oldest first")


class PreferenceSet(_Model):
    type: str
    value: Any
    confidence: float
    last_updated: float


class PreferenceDeleted(_Model):
    type: str
    deleted: bool


class HealthResponse(_Model):
    status: Literal["ok"]


class ReadyResponse(_Model):
    status: Literal["ready", "not_ready"]
    redis: str = Field(description='"ok", or "unreachable: <error>"')
    acl: Literal["ok", "resynced"] | None = Field(
        None, description="namespace ACLs present, or re-synced just now"
    )
    qdrant: str = Field(description='"ok", or "unreachable: <error>"')
    knowledge_points: int | None = None
    clamd: str | None = Field(
        None,
        description='the upload scanner: "ok", "unavailable: <error>" or "not configured"; '
        "reported only (uploads refuse with 503 by themselves while it is down)",
    )


class IntentOut(_Model):
    l2: list[str] = Field(description="the L2 key kinds the intent reads")
    l3: bool = Field(description="whether the intent searches L3")
    about: str


# --- error bodies ----------------------------------------------------------------------------


class ErrorResponse(BaseModel):
    """A platform error (:mod:`context_core.errors`): its code, a message saying what to do,
    and the error class's own fields (``session_id``, ``key``, ``current_version``,
    ``limit_bytes``, ``quota``, ``retry_after_s``, ``backend`` ...)."""

    model_config = ConfigDict(extra="allow")

    error: str
    detail: str


class AuthErrorResponse(_Model):
    """A missing or unknown ``X-API-Key``."""

    detail: str


class ValidationIssue(_Model):
    """One invalid field: FastAPI's ``loc``/``msg``/``type`` plus what was allowed."""

    loc: list[str | int]
    msg: str
    type: str
    field: str
    allowed: list[str] | None = None
    pattern: str | None = None
    limit: float | None = None
    expected: str | None = None


class ValidationErrorResponse(_Model):
    """422: ``invalid_request`` with one issue per field, or ``input_too_deep``."""

    error: Literal["invalid_request", "input_too_deep"]
    detail: list[ValidationIssue] | str


_ERRORS: dict[int, tuple[type[BaseModel], str]] = {
    401: (AuthErrorResponse, "missing or unknown X-API-Key"),
    403: (ErrorResponse, "the state's signature does not match, or access denied"),
    404: (ErrorResponse, "no such session for this agent (another agent's looks the same)"),
    409: (ErrorResponse, "stale or replayed state, or a required L2 key is missing or expired"),
    413: (ErrorResponse, "request body, step result or resulting L1 state too large"),
    422: (ValidationErrorResponse, "invalid input, naming the field and what is allowed"),
    423: (ErrorResponse, "the task contract is locked (error_recovery until recovery_complete)"),
    429: (ErrorResponse, "over a per-agent quota; see Retry-After"),
    503: (ErrorResponse, "overloaded or a backend is unreachable; see Retry-After"),
}

#: What every authenticated session endpoint may answer besides success.
SESSION_ERRORS = (401, 403, 404, 409, 413, 422, 429, 503)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that may answer ``codes`` (bodies published as above)."""
    return {c: {"model": _ERRORS[c][0], "description": _ERRORS[c][1]} for c in codes}


# --- uploads (POST /v1/uploads) --------------------------------------------------------------


class UploadResponse(_Model):
    """201: the file passed the scan, the keyword check and the DLP, and is indexed in the
    hot collection under ``scope`` until ``expires_at``."""

    source: str = Field(description="upload:<agent>/<file name>, the name cleaned")
    filename: str
    content_type: str
    bytes: int
    sha256: str = Field(description="of the file as sent; part of every point id")
    collection: str
    scope: str = Field(description='"agent:<id>" (private), a shared namespace, or system')
    chunks: int
    point_ids: list[str]
    replaced: int = Field(description="chunks of an earlier version of the same file removed")
    expires_at: float = Field(description="epoch seconds (CTX_UPLOAD_TTL_HOURS)")
    redactions: dict[str, int] = Field(description="what the DLP removed, by kind")
    sections: int
    encoding: str | None = Field(description="charset the text was read with (text, HTML)")
    decode_errors: int = Field(description="undecodable bytes replaced by U+FFFD")


class UploadRefusedResponse(_Model):
    """422: the file was refused and quarantined: malware, a blocked keyword, unreadable.
    Names the signature or keyword; never echoes the file's content."""

    error: Literal["upload_infected", "upload_blocked", "upload_unreadable"]
    detail: str
    reason: Literal["infected", "blocked_keyword", "unreadable"]
    quarantine_id: str | None = Field(description="the kept copy (None if keeping it failed)")
    signature: str | None = None
    keyword: str | None = None


class UnsupportedTypeResponse(_Model):
    """415: the declared type (or the extension) is not one an upload may have."""

    error: Literal["unsupported_media_type"]
    detail: str
    allowed: list[str]
    declared: str
