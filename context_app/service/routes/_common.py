"""What the route modules share: path parameters, error tables, the caller's identity in L1,
opening the sealed state of a request, sealing the state of an answer, and the responses
encoded once by the wire encoder.

The hot endpoints return JSON encoded once by the library's encoder
(:func:`context_core.session.wire.encode_json`) from the library's own wire models (the bundle,
the signed state), with no second validation pass; ``response_model`` on the route publishes
the same models in OpenAPI, and tests/test_openapi_contract.py checks the bytes against it.
Every router is declared with :class:`~context_app.service.direct_route.DirectRoute` (see
:func:`resource_router`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.direct_route import DirectRoute
from context_app.service.errors_map import json_response
from context_app.service.models import (
    ID_PATTERN,
    SESSION_ERRORS,
    StateIn,
    WireState,
    error_responses,
)
from context_core.access.auth import AgentKey
from context_core.errors import StateTooLargeError
from context_core.session.state import AuthContext, SessionState
from context_core.session.wire import encode_json

__all__ = [
    "ERRORS",
    "EVENT_ERRORS",
    "PathCallId",
    "PathSessionId",
    "StateOut",
    "agent_auth",
    "opened_for",
    "plain_json",
    "resource_router",
    "sealed_out",
    "session_info",
    "state_response",
    "unchanged_out",
    "wire_out",
    "wire_response",
]

PathSessionId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN)]
PathCallId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN)]

ERRORS = error_responses(*SESSION_ERRORS)
EVENT_ERRORS = error_responses(*SESSION_ERRORS, 423)


def resource_router() -> APIRouter:
    """A resource's router: its routes skip FastAPI's generic dependency solver when they can
    (:mod:`~context_app.service.direct_route`); the app factory includes it."""
    return APIRouter(route_class=DirectRoute)


def agent_auth(who: AgentKey) -> AuthContext:
    """The calling agent as L1 records it."""
    return AuthContext(agent_id=who.agent_id, scopes=tuple(who.purposes), org=who.org)


def opened_for(svc: Services, state: StateIn, session_id: str, who: AgentKey) -> WireState:
    """The request's state opened for this session and the caller's organisation: sealed, or
    signed until ``CTX_STATE_LEGACY_UNTIL``; :class:`~context_core.errors.SealedStateError`
    (403 ``state_refused``) naming what is wrong otherwise."""
    return svc.codec.open(state, org=who.org, session_id=session_id)


def session_info(wire: WireState) -> dict[str, Any]:
    """What a client may read of its state, in clear, beside the sealed string."""
    return {"session_id": wire.session_id, "step": wire.current_step, "version": wire.version}


@dataclass(frozen=True)
class StateOut:
    """A state going out: ``sealed`` what the client gets, ``session`` its clear info;
    ``stored`` the signed JSON an event commits to Redis (the latest state, read by
    ``GET .../state``, the idle sweep and erasure)."""

    wire: WireState
    sealed: str
    session: dict[str, Any]

    @property
    def stored(self) -> bytes:
        return encode_json(self.wire)


def sealed_out(svc: Services, wire: WireState, org: str) -> StateOut:
    """``wire`` sealed for ``org``; refused (413) when the sealed string is over
    ``CTX_L1_MAX_STATE_BYTES`` (no request could send it back)."""
    sealed = svc.codec.seal(wire, org=org)
    size, cap = len(sealed), svc.settings.l1_max_state_bytes
    if size > cap:
        raise StateTooLargeError(
            f"the session's sealed L1 state would be {size} bytes, over the "
            f"{cap}-byte limit (CTX_L1_MAX_STATE_BYTES); nothing was applied to L1 and the "
            "state you sent is still valid: trim the trace with a context_overflow event "
            "(keep_pairs) or send shorter texts, then retry",
            limit_bytes=cap,
        )
    return StateOut(wire, sealed, session_info(wire))


def wire_response(payload: Any, status_code: int = 200) -> Response:
    """``payload`` encoded once by the wire encoder (FastAPI's forgiving one for a value it
    cannot hold)."""
    try:
        body = encode_json(payload)
    except TypeError:
        return json_response(payload, status_code)
    return Response(body, status_code=status_code, media_type="application/json")


def state_response(out: StateOut, info: Any, status_code: int = 200) -> Response:
    """``{"state": <sealed>, "session": ..., "info": ...}``; ``info`` passes FastAPI's
    encoder first (effects may hold any value)."""
    head = {"state": out.sealed, "session": out.session}
    try:
        info_json = encode_json(info if plain_json(info) else jsonable_encoder(info))
    except TypeError:
        return json_response({**head, "info": info}, status_code)
    body = encode_json(head)[:-1] + b',"info":' + info_json + b"}"
    return Response(body, status_code=status_code, media_type="application/json")


_PLAIN = (str, int, float, bool, type(None))


def plain_json(value: Any, depth: int = 0) -> bool:
    """Only JSON's own types (exact types: no enum, no subclass), so FastAPI's encoder would
    hand it back as it is and the wire encoder can take it directly."""
    t = type(value)
    if t in _PLAIN:
        return True
    if depth > 32:
        return False
    if t is dict:
        return all(type(k) is str and plain_json(v, depth + 1) for k, v in value.items())
    if t is list or t is tuple:
        return all(plain_json(v, depth + 1) for v in value)
    return False


def unchanged_out(svc: Services, sent: StateIn, wire: WireState, org: str) -> StateOut:
    """The state a request sent, answered unchanged: the same sealed string (it just opened
    for this organisation and session), or a signed one sealed now (the migration moves
    it over)."""
    if isinstance(sent, str):
        return StateOut(wire, sent, session_info(wire))
    return sealed_out(svc, wire, org)


def wire_out(svc: Services, state: SessionState, version: int, nonce: str, org: str) -> StateOut:
    """A new state signed (for Redis) and sealed for ``org`` (for the client); refused (413)
    when the sealed string is over ``CTX_L1_MAX_STATE_BYTES``."""
    return sealed_out(svc, WireState.of(state, svc.state_key, version=version, nonce=nonce), org)
