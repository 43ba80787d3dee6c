"""The gRPC messages <-> the HTTP API's bodies (context_app/rpc/convert.py), without a server:
the shapes that differ (the event's oneof, series points, extra params, the optional prompt)
and the error status built from an HTTP error body."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2

from context_app.rpc import convert
from context_app.rpc.status import grpc_status_of
from context_app.rpc.v1 import context_pb2 as pb
from context_app.service.models import ContextRequest, EventRequest

BUNDLE: dict[str, Any] = {
    "session_id": "s-1",
    "step": 2,
    "intent": "generate_report",
    "resolved_intent": "generate_report",
    "fragments": [
        {
            "layer": "L3",
            "source": "L3:sop-12#3",
            "content": {"text": "replace the bearing", "pages": [3, 4]},
            "relevance": 0.71,
            "freshness_hours": 1.5,
            "confidence": 0.6,
            "label": "low",
            "note": "for reference only",
            "p_relevant": None,
            "confidence_signal": "cosine",
        }
    ],
    "degraded": False,
    "timings_ms": {"l1": 0.1, "total": 3.2},
    "context_used": {
        "l1": [],
        "l2": [],
        "l3": ["sop-12#3"],
        "l3_reference": [],
        "ns": [],
        "by_reference": [],
        "fallback": None,
    },
    "trace_id": "tr-1",
}
PROMPT = {
    "intent": "generate_report",
    "template": "generate_report.j2",
    "text": "The report format, from L3: ...",
    "bindings": [
        {"field": "report_template", "layer": "l3", "key": "sop-12#3", "status": "notice",
         "confidence": 0.6},
        {"field": "user_query", "layer": "l1", "key": "user_query", "status": "bound",
         "confidence": None},
    ],
    "context_used": ["l3:sop-12#3"],
}  # fmt: skip


def test_bundle_without_prompt_has_none() -> None:
    msg = convert.bundle_message(BUNDLE)
    assert not msg.HasField("prompt")
    assert not msg.fragments[0].HasField("p_relevant")
    assert msg.fragments[0].content.struct_value["pages"][1] == 4
    assert not msg.context_used.HasField("fallback")


def test_prompt_from_the_dict_or_from_the_response_object() -> None:
    from_dict = convert.bundle_message({**BUNDLE, "prompt": PROMPT})
    # an answer object whose dict form lacks the prompt (before prompt binding's merge)
    obj = SimpleNamespace(
        to_dict=lambda: dict(BUNDLE), prompt=SimpleNamespace(to_dict=lambda: PROMPT)
    )
    from_obj = convert.bundle_message(obj)
    for msg in (from_dict, from_obj):
        assert msg.HasField("prompt")
        assert msg.prompt.text == PROMPT["text"]
        assert [b.status for b in msg.prompt.bindings] == ["notice", "bound"]
        assert msg.prompt.bindings[0].confidence == pytest.approx(0.6)
        assert not msg.prompt.bindings[1].HasField("confidence")
        assert list(msg.prompt.context_used) == ["l3:sop-12#3"]
    null_prompt = SimpleNamespace(to_dict=lambda: {**BUNDLE, "prompt": None}, prompt=None)
    assert not convert.bundle_message(null_prompt).HasField("prompt")


def test_tool_call_event_becomes_the_http_body() -> None:
    args, result = struct_pb2.Struct(), struct_pb2.Value()
    args.update({"device": "P-1", "n": 12})
    result.struct_value.update({"rms": 4.1, "points": 12})
    call = pb.ToolCall(name="read", args=args, result=result, store_step=False)
    call.series["P-1.vibration"].points.extend([pb.Point(ts=1.0, value=0.0)])
    body = convert.event_body(
        pb.EventRequest(session_id="s-1", state='{"a": 1}', event=pb.Event(tool_call=call))
    )
    ev = body["event"]
    assert body["state"] == {"a": 1}
    assert ev["type"] == "tool_call" and ev["store_step"] is False
    assert "advance" not in ev and "status" not in ev  # unset: the model's defaults apply
    assert ev["args"] == {"device": "P-1", "n": 12} and type(ev["args"]["n"]) is int
    assert ev["result"] == {"rms": 4.1, "points": 12}
    assert ev["series"] == {"P-1.vibration": [[1.0, 0.0]]}
    empty = convert.event_body(
        pb.EventRequest(state="{}", event=pb.Event(session_timeout=pb.Empty()))
    )
    assert empty["event"] == {"type": "session_timeout"}
    with pytest.raises(Exception) as info:
        EventRequest.model_validate({"state": {}, "event": {}})
    assert "event" in str(info.value)


def test_context_params_extra_sit_beside_the_typed_ones() -> None:
    params = pb.ContextParams(device="P-1")
    params.extra["window"].string_value = "1h"
    params.api_params.update({"device": "P-1"})
    body = convert.context_body("s-1", '{"x": 1}', "call_api", params)
    assert body["params"] == {"device": "P-1", "window": "1h", "api_params": {"device": "P-1"}}
    assert "delta" not in body
    delta = convert.context_body("s-1", "{}", "call_api", pb.ContextParams(), delta=True,
                                 since_bundle="1.0a0b0c0d")  # fmt: skip
    assert delta["delta"] is True and delta["since_bundle"] == "1.0a0b0c0d"
    with pytest.raises(Exception) as info:  # the HTTP model's checks hold
        ContextRequest.model_validate({**body, "state": {}})
    assert "state" in str(info.value)


def test_a_sealed_state_travels_as_the_string_it_is() -> None:
    sealed = "ctx1.k1.q83vEjRWeJC"
    assert convert.state_value(sealed) == sealed  # HTTP's body carries the same string
    reply = convert.state_reply(
        {"state": sealed, "session": {"session_id": "s-1", "step": 2, "version": 3}, "info": {}}
    )
    assert reply.state == sealed  # not JSON-quoted
    assert (reply.session.session_id, reply.session.step, reply.session.version) == ("s-1", 2, 3)


def test_a_state_that_is_not_json_is_a_field_error() -> None:
    from fastapi.exceptions import RequestValidationError

    with pytest.raises(RequestValidationError) as info:
        convert.state_value("{not json")
    assert info.value.errors()[0]["loc"] == ("body", "state")


def test_status_carries_error_info_field_violations_and_retry() -> None:
    body = {
        "error": "invalid_request",
        "detail": [
            {"loc": ["body", "step_intent"], "msg": "unknown step_intent 'x'", "type": "enum",
             "field": "step_intent", "allowed": ["a", "b"]},
        ],
    }  # fmt: skip
    st = grpc_status_of(422, body)
    assert st.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "step_intent" in st.details and '["a", "b"]' in st.details
    raw = dict(st.trailing_metadata)["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    status.details[0].Unpack(info)
    status.details[1].Unpack(bad)
    assert info.reason == "invalid_request" and info.metadata["http_status"] == "422"
    assert [v.field for v in bad.field_violations] == ["step_intent"]

    busy = grpc_status_of(503, {"error": "overloaded", "detail": "busy", "retry_after_s": 2})
    assert busy.code == grpc.StatusCode.UNAVAILABLE
    status = status_pb2.Status.FromString(dict(busy.trailing_metadata)["grpc-status-details-bin"])
    retry = error_details_pb2.RetryInfo()
    assert status.details[-1].Unpack(retry) and retry.retry_delay.seconds == 2
    assert grpc_status_of(423, {"error": "contract_locked", "detail": "x"}).code == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
