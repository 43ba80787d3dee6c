"""What the route modules share: path parameters, error tables, the caller's identity in L1,
the signed-state check and the responses encoded once by the wire encoder.

The hot endpoints return JSON encoded once by the library's encoder
(:func:`context_core.session.wire.encode_json`) from the library's own wire models (the bundle,
the signed state), with no second validation pass; ``response_model`` on the route publishes
the same models in OpenAPI, and tests/test_openapi_contract.py checks the bytes against it.
Every router is declared with :class:`~context_app.service.direct_route.DirectRoute` (see
:func:`resource_router`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.direct_route import DirectRoute
from context_app.service.errors_map import json_response
from context_app.service.models import ID_PATTERN, SESSION_ERRORS, WireState, error_responses
from context_core.access.auth import AgentKey
from context_core.errors import AccessDeniedError, StateTooLargeError
from context_core.session.state import AuthContext, SessionState
from context_core.session.wire import encode_json

__all__ = [
    "ERRORS",
    "EVENT_ERRORS",
    "PathCallId",
    "PathSessionId",
    "agent_auth",
    "plain_json",
    "resource_router",
    "signed_for",
    "state_response",
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


def signed_for(svc: Services, wire: WireState, session_id: str) -> None:
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
        info_json = encode_json(info if plain_json(info) else jsonable_encoder(info))
    except TypeError:
        return json_response({"state": json.loads(state_json), "info": info}, status_code)
    body = b'{"state":' + state_json + b',"info":' + info_json + b"}"
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


def wire_out(svc: Services, state: SessionState, version: int, nonce: str) -> bytes:
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
