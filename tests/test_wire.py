"""The wire declarations agree with what produces and consumes them.

One model per wire concept (:mod:`context_core.session.wire`, :mod:`context_core.traces`): these
tests fail when a field is added on one side only: SessionState vs WireState, Fragment and
ContextBundle vs their wire models, bundle fragments vs trace records, and each lifecycle
event's handler vs its request model and its documented effects.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any

import numpy as np
import pytest

from context_app.service.models import CreateSessionRequest, Event, EventRequest
from context_core.gateway.sanitize import Gateway
from context_core.lifecycle.manager import (
    EFFECTS,
    LifecycleEvent,
    LifecycleManager,
    payload_parameters,
)
from context_core.routing.bundle import ContextBundle, Fragment, reference_entry
from context_core.session.state import ApiResultPointer, AuthContext, SessionState, TraceItem
from context_core.session.wire import (
    L1_FIELDS,
    BundleWire,
    WireApiResult,
    WireState,
    WireTraceItem,
    _legacy_signature,
    encode_json,
)
from context_core.traces import FragmentTrace, ReferenceTrace, fragment_entry

KEY = b"k" * 32


def _state() -> SessionState:
    s = SessionState.start(
        "s-wire", "u-1", "why is PUMP-0042 hot?", gateway=Gateway(), auth=AuthContext("agent-a")
    )
    s = s.record_tool_call("fetch", {"device": "PUMP-0042"}, call_id="c1")
    s = s.record_tool_result("c1", {"temp_c": 81.5}, status="ok")
    return s.advance(current_step=2, last_device_id="PUMP-0042")


def _bundle() -> ContextBundle:
    step = {"temp_c": 81.5, "device": "PUMP-0042"}
    page = {"page": "10816-3", "text": "7.1 mm/s"}
    frags = (
        Fragment("L2", "L2:wm:{s-1}:step:1", step, 1.0, 0.1, 1.0, "exact"),
        Fragment("L3", "L3:knowledge_main:p-1", page, 0.8, 5.0, 0.8, "confident"),
    )
    left_out = Fragment("L1", "L1:session.user_query", "q", 1.0, 0.0, 1.0, "exact")
    used = {
        "l1": [], "l2": ["wm:{s-1}:step:1"], "l3": ["p-1"], "l3_reference": [], "ns": [],
        "by_reference": [reference_entry(left_out)],
    }  # fmt: skip
    timings = {"l1": 0.1, "l2": 0.5, "l3": 3.0, "total": 4.0}
    return ContextBundle(
        "s-1", 2, "diagnose", frags, False, timings, used, "a" * 32, resolved_intent="default"
    )


# --- L1 on the wire --------------------------------------------------------------------------


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_wire_state_carries_every_l1_field_and_nothing_else() -> None:
    assert set(L1_FIELDS) == _fields(SessionState) - {"gateway", "auth_context", "offload"}
    assert set(WireTraceItem.model_fields) == _fields(TraceItem)
    assert set(WireApiResult.model_fields) == _fields(ApiResultPointer)


def test_signed_state_round_trips_through_json() -> None:
    state = _state().advance(last_api_result=ApiResultPointer("ok", "0" * 64))
    wire = WireState.of(state, KEY, version=4, nonce="ab" * 16)
    echoed = WireState.model_validate_json(encode_json(wire))
    assert echoed.verify(KEY) and echoed.version == 4 and echoed.nonce == "ab" * 16
    back = echoed.to_state(gateway=Gateway(), auth=AuthContext("agent-a"))
    assert back == state  # what the agent knows, field by field
    assert not echoed.model_copy(update={"current_step": 9}).verify(KEY)
    assert not echoed.verify(b"x" * 32)


def test_a_state_signed_over_the_earlier_canonical_form_still_verifies() -> None:
    # 1e16 is where the two encodings differ: json.dumps writes 1e+16, msgspec 1e16
    state = dataclasses.replace(_state(), start_time=1e16)
    wire = WireState.of(state, KEY, version=2, nonce="cd" * 16)
    body = wire.signed_part()
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert "1e+16" in canon  # the case is real: the legacy bytes differ from the new ones
    old = wire.model_copy(update={"sig": _legacy_signature(KEY, body)})
    assert old.sig != wire.sig
    assert wire.verify(KEY) and old.verify(KEY)
    echoed = WireState.model_validate_json(encode_json(old))  # as a client sends it back
    assert echoed.verify(KEY)
    for signed in (wire, old):  # either signature covers its fields, and only those
        assert not signed.model_copy(update={"current_step": 7}).verify(KEY)
        assert not signed.model_copy(update={"start_time": 1.0}).verify(KEY)
        assert not signed.verify(b"x" * 32)


# --- the bundle ------------------------------------------------------------------------------


def test_bundle_dict_is_exactly_the_published_model() -> None:
    b = _bundle()
    d = b.to_dict()
    assert list(d) == list(BundleWire.model_fields)
    assert BundleWire.model_validate(d).model_dump(exclude_unset=True) == json.loads(json.dumps(d))
    assert json.loads(b.to_json()) == d
    assert d["resolved_intent"] == "default"


def test_a_bundle_key_the_model_does_not_declare_is_refused() -> None:
    d = _bundle().to_dict()
    with pytest.raises(ValueError, match="extra"):
        BundleWire.model_validate({**d, "context_used": {**d["context_used"], "surprise": 1}})


def test_fragments_and_references_match_their_trace_records() -> None:
    b = _bundle()
    for f in b.fragments:
        FragmentTrace.model_validate(fragment_entry(f))
    for ref in b.context_used["by_reference"]:
        ReferenceTrace.model_validate(ref)


def test_encode_json_nulls_non_finite_floats_and_keeps_unicode() -> None:
    raw = encode_json({"x": math.nan, "y": [1.5, math.inf], "n": np.float32(0.5), "t": "Ü"})
    assert json.loads(raw) == {"x": None, "y": [1.5, None], "n": 0.5, "t": "Ü"}
    assert "Ü".encode() in raw
    with pytest.raises(TypeError):
        encode_json({"o": object()})


# --- lifecycle events ------------------------------------------------------------------------


def _event_models() -> dict[str, Any]:
    union = typing.get_args(typing.get_args(Event)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in union}


def test_every_event_has_one_request_model_a_handler_and_documented_effects() -> None:
    events = {e.value for e in LifecycleEvent}
    assert set(_event_models()) | {"session_start"} == events
    assert {e.value for e in EFFECTS} == events
    assert EventRequest.model_fields["event"].annotation is not None


@pytest.mark.parametrize("event", [e.value for e in LifecycleEvent if e.value != "session_start"])
def test_event_request_model_matches_its_handler(event: str) -> None:
    """Every field the service sends is a parameter of the handler, and every parameter the
    handler requires is a field of the model (so the payload binds)."""
    params = payload_parameters(event)
    fields = set(_event_models()[event].model_fields) - {"type"}
    assert fields <= set(params), f"{event}: model fields the handler lacks: {fields - set(params)}"
    required = {n for n, req in params.items() if req}
    assert required <= fields, f"{event}: handler needs {required - fields}"


def test_session_start_request_matches_its_handler() -> None:
    params = payload_parameters("session_start")
    assert set(CreateSessionRequest.model_fields) <= set(params)
    assert {n for n, req in params.items() if req} <= set(CreateSessionRequest.model_fields)


def test_handlers_follow_the_naming_the_declaration_reads() -> None:
    manager = LifecycleManager(wm=None, gateway=Gateway())  # type: ignore[arg-type]
    for e in LifecycleEvent:
        assert manager._handlers[e].__func__ is getattr(LifecycleManager, f"_{e.value}")  # type: ignore[attr-defined]
