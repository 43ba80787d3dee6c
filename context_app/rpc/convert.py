"""Messages of ``context.v1`` to the HTTP API's request bodies, and answers back to messages.

A request message becomes the JSON body the HTTP route takes (field names are the same), and
is validated by the same pydantic model, so a field has the same limits and an error names it
the same way (``event.tool_call.name``). Only three shapes differ: the event is a ``oneof``
(its set field is HTTP's ``type``), series points are messages (HTTP: ``[ts, value]`` pairs)
and context params beyond the typed ones sit in ``extra`` (HTTP: beside them). Answers are
the HTTP answers' dicts parsed into the reply messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from google.protobuf import json_format
from google.protobuf.message import Message

from context_app.rpc.v1 import context_pb2 as pb

__all__ = [
    "bundle_message",
    "context_body",
    "create_body",
    "delta_message",
    "event_body",
    "message_dict",
    "output_body",
    "output_reply",
    "state_reply",
    "state_value",
]


_EXACT = 2**53


def _json_numbers(value: Any) -> Any:
    """Integral doubles as ints: a Struct holds every number as a double, and ``12`` sent
    by the client must be stored as JSON's ``12``, as over HTTP (not ``12.0``)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < _EXACT else value
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_numbers(v) for v in value]
    return value


def message_dict(msg: Message) -> dict[str, Any]:
    """``msg`` as JSON: proto field names, scalars without presence written even when
    default (an empty required string is "too short", as over HTTP, not "missing"),
    integral numbers as integers."""
    return _json_numbers(
        json_format.MessageToDict(
            msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    )


def state_value(text: str, field: str = "state") -> Any:
    """The opaque state string as the JSON value HTTP carries in ``state``: the sealed
    string as it is; a JSON object (the old signed state, accepted until
    ``CTX_STATE_LEGACY_UNTIL``) parsed."""
    if not text.lstrip().startswith("{"):
        return text  # sealed (or not a state: opening it refuses it, 403 as over HTTP)
    try:
        return json.loads(text)
    except ValueError:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", field),
                    "msg": "state is not the string the service returned: send the latest "
                    "answer's state unchanged",
                }
            ]
        ) from None


def _params(msg: pb.ContextParams) -> dict[str, Any]:
    d = message_dict(msg)
    extra = d.pop("extra", {}) or {}
    return {**extra, **d}


def create_body(msg: pb.CreateSessionRequest) -> dict[str, Any]:
    return message_dict(msg)


def event_body(msg: pb.EventRequest) -> dict[str, Any]:
    """``{"state": ..., "event": {"type": <the oneof's field>, ...}}``."""
    ev = msg.event
    kind = ev.WhichOneof("kind")
    event: dict[str, Any]
    if kind is None:
        event = {}  # HTTP's body without "type": a 422 naming event
    else:
        sub = getattr(ev, kind)
        event = {"type": kind, **message_dict(sub)}
        if kind == "tool_call":
            event.pop("series", None)
            if sub.series:
                event["series"] = {
                    name: [[p.ts, p.value] for p in s.points] for name, s in sub.series.items()
                }
    return {"state": state_value(msg.state), "event": event}


def context_body(
    session_id: str,
    state: str,
    step_intent: str,
    params: pb.ContextParams,
    *,
    delta: bool = False,
    since_bundle: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "session_id": session_id,
        "step_intent": step_intent,
        "state": state_value(state),
        "params": _params(params),
    }
    if delta:
        body["delta"] = True
        if since_bundle is not None:
            body["since_bundle"] = since_bundle
    return body


def output_body(msg: pb.OutputRequest) -> dict[str, Any]:
    d = message_dict(msg)
    d.pop("session_id", None)
    d["state"] = state_value(msg.state)
    return d


def _with_prompt(answer: Any) -> dict[str, Any]:
    """The answer as a dict, with ``prompt`` from the answer object when it carries one and
    its dict form does not (prompt binding: null when no template applies)."""
    if isinstance(answer, Mapping):
        d = dict(answer)
    else:
        d = answer.model_dump() if hasattr(answer, "model_dump") else answer.to_dict()
    if d.get("prompt") is None:
        prompt = getattr(answer, "prompt", None)
        if prompt is not None:
            d["prompt"] = prompt.to_dict() if hasattr(prompt, "to_dict") else prompt
    if d.get("prompt") is None:
        d.pop("prompt", None)
    return d


def bundle_message(answer: Any) -> pb.ContextBundle:
    """A ContextResponse (dict, or an object with ``prompt``) as its message."""
    return json_format.ParseDict(_with_prompt(answer), pb.ContextBundle())


def delta_message(answer: Any) -> pb.ContextDelta:
    """A ContextDeltaResponse (dict, or an object with ``prompt``) as its message."""
    return json_format.ParseDict(_with_prompt(answer), pb.ContextDelta())


def _state_text(state: Any) -> str:
    if isinstance(state, str):  # sealed: already the opaque string
        return state
    return json.dumps(state, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _session(msg: pb.SessionInfo, answer: Mapping[str, Any]) -> None:
    """The answer's clear ``session`` info into the reply's."""
    info = answer.get("session") or {}
    msg.session_id = str(info.get("session_id", ""))
    msg.step = int(info.get("step", 0))
    msg.version = int(info.get("version", 0))


def state_reply(answer: Mapping[str, Any]) -> pb.StateReply:
    reply = pb.StateReply(state=_state_text(answer["state"]))
    _session(reply.session, answer)
    reply.info.update(answer.get("info") or {})
    return reply


def output_reply(answer: Mapping[str, Any]) -> pb.OutputReply:
    reply = pb.OutputReply(state=_state_text(answer["state"]), output=answer["output"])
    _session(reply.session, answer)
    reply.info.update(answer.get("info") or {})
    for item in answer.get("removed") or []:
        reply.removed.add(kind=item["kind"], value=item["value"], detail=item["detail"])
    return reply
