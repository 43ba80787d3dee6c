from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ("user_id", "user_query", "session_id", "device_id", "contract")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    USER_QUERY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    user_query: str
    session_id: str
    device_id: str
    contract: _struct_pb2.Struct
    def __init__(self, user_id: _Optional[str] = ..., user_query: _Optional[str] = ..., session_id: _Optional[str] = ..., device_id: _Optional[str] = ..., contract: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class SessionRef(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class StateReply(_message.Message):
    __slots__ = ("state", "info", "session")
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    state: str
    info: _struct_pb2.Struct
    session: SessionInfo
    def __init__(self, state: _Optional[str] = ..., info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., session: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "step", "version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    version: int
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ("session_id", "deleted_keys")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_KEYS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    deleted_keys: int
    def __init__(self, session_id: _Optional[str] = ..., deleted_keys: _Optional[int] = ...) -> None: ...

class EventRequest(_message.Message):
    __slots__ = ("session_id", "state", "event")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: str
    event: Event
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[str] = ..., event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("tool_call", "user_correction", "context_overflow", "session_timeout", "goal_achieved", "error_recovery", "user_message", "recovery_complete")
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    USER_CORRECTION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    GOAL_ACHIEVED_FIELD_NUMBER: _ClassVar[int]
    ERROR_RECOVERY_FIELD_NUMBER: _ClassVar[int]
    USER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    tool_call: ToolCall
    user_correction: UserCorrection
    context_overflow: ContextOverflow
    session_timeout: Empty
    goal_achieved: GoalAchieved
    error_recovery: Empty
    user_message: UserMessage
    recovery_complete: Empty
    def __init__(self, tool_call: _Optional[_Union[ToolCall, _Mapping]] = ..., user_correction: _Optional[_Union[UserCorrection, _Mapping]] = ..., context_overflow: _Optional[_Union[ContextOverflow, _Mapping]] = ..., session_timeout: _Optional[_Union[Empty, _Mapping]] = ..., goal_achieved: _Optional[_Union[GoalAchieved, _Mapping]] = ..., error_recovery: _Optional[_Union[Empty, _Mapping]] = ..., user_message: _Optional[_Union[UserMessage, _Mapping]] = ..., recovery_complete: _Optional[_Union[Empty, _Mapping]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Point(_message.Message):
    __slots__ = ("ts", "value")
    TS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ts: float
    value: float
    def __init__(self, ts: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("points",)
    POINTS_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[Point]
    def __init__(self, points: _Optional[_Iterable[_Union[Point, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("name", "args", "result", "status", "call_id", "store_step", "advance", "device_id", "series")
    class SeriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Series
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Series, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_STEP_FIELD_NUMBER: _ClassVar[int]
    ADVANCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    args: _struct_pb2.Struct
    result: _struct_pb2.Value
    status: str
    call_id: str
    store_step: bool
    advance: bool
    device_id: str
    series: _containers.MessageMap[str, Series]
    def __init__(self, name: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., status: _Optional[str] = ..., call_id: _Optional[str] = ..., store_step: _Optional[bool] = ..., advance: _Optional[bool] = ..., device_id: _Optional[str] = ..., series: _Optional[_Mapping[str, Series]] = ...) -> None: ...

class UserCorrection(_message.Message):
    __slots__ = ("fields", "user_query")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    USER_QUERY_FIELD_NUMBER: _ClassVar[int]
    fields: _struct_pb2.Struct
    user_query: str
    def __init__(self, fields: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., user_query: _Optional[str] = ...) -> None: ...

class ContextOverflow(_message.Message):
    __slots__ = ("keep_pairs", "low_priority_ttl_s")
    KEEP_PAIRS_FIELD_NUMBER: _ClassVar[int]
    LOW_PRIORITY_TTL_S_FIELD_NUMBER: _ClassVar[int]
    keep_pairs: int
    low_priority_ttl_s: int
    def __init__(self, keep_pairs: _Optional[int] = ..., low_priority_ttl_s: _Optional[int] = ...) -> None: ...

class GoalAchieved(_message.Message):
    __slots__ = ("answers", "grace_s")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    grace_s: int
    def __init__(self, answers: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., grace_s: _Optional[int] = ...) -> None: ...

class UserMessage(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ContextParams(_message.Message):
    __slots__ = ("device", "section", "query", "endpoint", "api_params", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    API_PARAMS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    device: str
    section: str
    query: str
    endpoint: str
    api_params: _struct_pb2.Struct
    extra: _containers.MessageMap[str, _struct_pb2.Value]
    def __init__(self, device: _Optional[str] = ..., section: _Optional[str] = ..., query: _Optional[str] = ..., endpoint: _Optional[str] = ..., api_params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., extra: _Optional[_Mapping[str, _struct_pb2.Value]] = ...) -> None: ...

class ContextRequest(_message.Message):
    __slots__ = ("session_id", "step_intent", "state", "params")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INTENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step_intent: str
    state: str
    params: ContextParams
    def __init__(self, session_id: _Optional[str] = ..., step_intent: _Optional[str] = ..., state: _Optional[str] = ..., params: _Optional[_Union[ContextParams, _Mapping]] = ...) -> None: ...

class ContextStep(_message.Message):
    __slots__ = ("step_intent", "params")
    STEP_INTENT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    step_intent: str
    params: ContextParams
    def __init__(self, step_intent: _Optional[str] = ..., params: _Optional[_Union[ContextParams, _Mapping]] = ...) -> None: ...

class ContextStreamRequest(_message.Message):
    __slots__ = ("session_id", "state", "steps", "since_bundle")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SINCE_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: str
    steps: _containers.RepeatedCompositeFieldContainer[ContextStep]
    since_bundle: str
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[ContextStep, _Mapping]]] = ..., since_bundle: _Optional[str] = ...) -> None: ...

class Fragment(_message.Message):
    __slots__ = ("layer", "source", "content", "relevance", "freshness_hours", "confidence", "label", "note", "p_relevant", "confidence_signal")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_HOURS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    P_RELEVANT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    layer: str
    source: str
    content: _struct_pb2.Value
    relevance: float
    freshness_hours: float
    confidence: float
    label: str
    note: str
    p_relevant: float
    confidence_signal: str
    def __init__(self, layer: _Optional[str] = ..., source: _Optional[str] = ..., content: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., relevance: _Optional[float] = ..., freshness_hours: _Optional[float] = ..., confidence: _Optional[float] = ..., label: _Optional[str] = ..., note: _Optional[str] = ..., p_relevant: _Optional[float] = ..., confidence_signal: _Optional[str] = ...) -> None: ...

class ContextUsed(_message.Message):
    __slots__ = ("l1", "l2", "l3", "l3_reference", "ns", "by_reference", "fallback")
    L1_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    L3_FIELD_NUMBER: _ClassVar[int]
    L3_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    NS_FIELD_NUMBER: _ClassVar[int]
    BY_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    l1: _containers.RepeatedScalarFieldContainer[str]
    l2: _containers.RepeatedScalarFieldContainer[str]
    l3: _containers.RepeatedScalarFieldContainer[str]
    l3_reference: _containers.RepeatedScalarFieldContainer[str]
    ns: _containers.RepeatedScalarFieldContainer[str]
    by_reference: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    fallback: _struct_pb2.Struct
    def __init__(self, l1: _Optional[_Iterable[str]] = ..., l2: _Optional[_Iterable[str]] = ..., l3: _Optional[_Iterable[str]] = ..., l3_reference: _Optional[_Iterable[str]] = ..., ns: _Optional[_Iterable[str]] = ..., by_reference: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., fallback: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("intent", "template", "text", "bindings", "context_used")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_USED_FIELD_NUMBER: _ClassVar[int]
    intent: str
    template: str
    text: str
    bindings: _containers.RepeatedCompositeFieldContainer[Binding]
    context_used: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, intent: _Optional[str] = ..., template: _Optional[str] = ..., text: _Optional[str] = ..., bindings: _Optional[_Iterable[_Union[Binding, _Mapping]]] = ..., context_used: _Optional[_Iterable[str]] = ...) -> None: ...

class Binding(_message.Message):
    __slots__ = ("field", "layer", "key", "status", "confidence")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    field: str
    layer: str
    key: str
    status: str
    confidence: float
    def __init__(self, field: _Optional[str] = ..., layer: _Optional[str] = ..., key: _Optional[str] = ..., status: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...

class ContextBundle(_message.Message):
    __slots__ = ("session_id", "step", "intent", "resolved_intent", "fragments", "degraded", "timings_ms", "context_used", "trace_id", "prompt")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_INTENT_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_USED_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    intent: str
    resolved_intent: str
    fragments: _containers.RepeatedCompositeFieldContainer[Fragment]
    degraded: bool
    timings_ms: _containers.ScalarMap[str, float]
    context_used: ContextUsed
    trace_id: str
    prompt: Prompt
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., intent: _Optional[str] = ..., resolved_intent: _Optional[str] = ..., fragments: _Optional[_Iterable[_Union[Fragment, _Mapping]]] = ..., degraded: _Optional[bool] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., context_used: _Optional[_Union[ContextUsed, _Mapping]] = ..., trace_id: _Optional[str] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ...) -> None: ...

class DeltaFragment(_message.Message):
    __slots__ = ("layer", "source", "content", "relevance", "freshness_hours", "confidence", "label", "note", "p_relevant", "confidence_signal", "hash", "pos")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_HOURS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    P_RELEVANT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    POS_FIELD_NUMBER: _ClassVar[int]
    layer: str
    source: str
    content: _struct_pb2.Value
    relevance: float
    freshness_hours: float
    confidence: float
    label: str
    note: str
    p_relevant: float
    confidence_signal: str
    hash: str
    pos: int
    def __init__(self, layer: _Optional[str] = ..., source: _Optional[str] = ..., content: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., relevance: _Optional[float] = ..., freshness_hours: _Optional[float] = ..., confidence: _Optional[float] = ..., label: _Optional[str] = ..., note: _Optional[str] = ..., p_relevant: _Optional[float] = ..., confidence_signal: _Optional[str] = ..., hash: _Optional[str] = ..., pos: _Optional[int] = ...) -> None: ...

class FragmentRef(_message.Message):
    __slots__ = ("id", "hash", "layer", "freshness_hours", "pos")
    ID_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_HOURS_FIELD_NUMBER: _ClassVar[int]
    POS_FIELD_NUMBER: _ClassVar[int]
    id: str
    hash: str
    layer: str
    freshness_hours: float
    pos: int
    def __init__(self, id: _Optional[str] = ..., hash: _Optional[str] = ..., layer: _Optional[str] = ..., freshness_hours: _Optional[float] = ..., pos: _Optional[int] = ...) -> None: ...

class ContextDelta(_message.Message):
    __slots__ = ("session_id", "step", "intent", "resolved_intent", "bundle_id", "base_bundle_id", "full", "fragments", "unchanged", "removed", "degraded", "timings_ms", "context_used", "trace_id", "prompt")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_INTENT_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_USED_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    intent: str
    resolved_intent: str
    bundle_id: str
    base_bundle_id: str
    full: bool
    fragments: _containers.RepeatedCompositeFieldContainer[DeltaFragment]
    unchanged: _containers.RepeatedCompositeFieldContainer[FragmentRef]
    removed: _containers.RepeatedScalarFieldContainer[str]
    degraded: bool
    timings_ms: _containers.ScalarMap[str, float]
    context_used: ContextUsed
    trace_id: str
    prompt: Prompt
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., intent: _Optional[str] = ..., resolved_intent: _Optional[str] = ..., bundle_id: _Optional[str] = ..., base_bundle_id: _Optional[str] = ..., full: _Optional[bool] = ..., fragments: _Optional[_Iterable[_Union[DeltaFragment, _Mapping]]] = ..., unchanged: _Optional[_Iterable[_Union[FragmentRef, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ..., degraded: _Optional[bool] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., context_used: _Optional[_Union[ContextUsed, _Mapping]] = ..., trace_id: _Optional[str] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ...) -> None: ...

class OutputRequest(_message.Message):
    __slots__ = ("session_id", "state", "trace_id", "output", "step", "format")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: str
    trace_id: str
    output: str
    step: int
    format: str
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[str] = ..., trace_id: _Optional[str] = ..., output: _Optional[str] = ..., step: _Optional[int] = ..., format: _Optional[str] = ...) -> None: ...

class RemovedItem(_message.Message):
    __slots__ = ("kind", "value", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    value: str
    detail: str
    def __init__(self, kind: _Optional[str] = ..., value: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class OutputReply(_message.Message):
    __slots__ = ("state", "info", "output", "removed", "session")
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    state: str
    info: _struct_pb2.Struct
    output: str
    removed: _containers.RepeatedCompositeFieldContainer[RemovedItem]
    session: SessionInfo
    def __init__(self, state: _Optional[str] = ..., info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., output: _Optional[str] = ..., removed: _Optional[_Iterable[_Union[RemovedItem, _Mapping]]] = ..., session: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...
