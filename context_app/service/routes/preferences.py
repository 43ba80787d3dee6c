"""``GET/PUT/DELETE /v1/sessions/{id}/preferences[/{type}]``: the structured preferences of
the session's user (``pref:{<org>:<uid>}:<type>``).

The user is the one the session was started for (read from its latest signed state) and the
organisation the calling agent's API key's, so an agent reaches only the preferences of its
own organisation's users whose sessions it owns. Setting one is session activity: it refreshes
the task contract's lifetime and the idle clock.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Path
from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import (
    PreferenceDeleted,
    PreferenceIn,
    PreferenceSet,
    PreferencesResponse,
    PrefType,
)
from context_app.service.routes._common import (
    ERRORS,
    PathSessionId,
    resource_router,
    wire_response,
)

__all__ = ["router"]

router = resource_router()

PathPrefType = Annotated[PrefType, Path()]


@router.get(
    "/v1/sessions/{session_id}/preferences",
    tags=["preferences"],
    response_model=PreferencesResponse,
    responses=ERRORS,
)
def get_preferences(session_id: PathSessionId, svc: Svc, who: Who) -> Response:
    """Every structured preference of the session's user."""
    prefs = svc.wm.preferences(who.org, _user_of(svc, session_id, who.agent_id)).all()
    return wire_response(
        {
            "session_id": session_id,
            "preferences": {t: _pref_dict(p) for t, p in sorted(prefs.items())},
        }
    )


@router.put(
    "/v1/sessions/{session_id}/preferences/{pref_type}",
    tags=["preferences"],
    response_model=PreferenceSet,
    responses=ERRORS,
)
def put_preference(
    session_id: PathSessionId,
    pref_type: PathPrefType,
    body: PreferenceIn,
    svc: Svc,
    who: Who,
    nbytes: BodyBytes,
) -> Response:
    """Set one preference (value cleaned by the gateway) with how sure the agent is."""
    user = _user_of(svc, session_id, who.agent_id)
    svc.quotas.charge(who.agent_id, nbytes, session_id=session_id)
    p = svc.wm.preferences(who.org, user).set(pref_type, body.value, confidence=body.confidence)
    svc.wm.session(session_id).touch()
    return wire_response({"type": pref_type, **_pref_dict(p)})


@router.delete(
    "/v1/sessions/{session_id}/preferences/{pref_type}",
    tags=["preferences"],
    response_model=PreferenceDeleted,
    responses=ERRORS,
)
def delete_preference(
    session_id: PathSessionId, pref_type: PathPrefType, svc: Svc, who: Who
) -> Response:
    """Forget one preference of the session's user."""
    user = _user_of(svc, session_id, who.agent_id)
    deleted = svc.wm.preferences(who.org, user).delete(pref_type)
    return wire_response({"type": pref_type, "deleted": bool(deleted)})


def _pref_dict(p: Any) -> dict[str, Any]:
    return {"value": p.value, "confidence": p.confidence, "last_updated": p.last_updated}


def _user_of(svc: Services, session_id: str, agent_id: str) -> str:
    """The user the session was started for, from its latest signed state (owner-checked)."""
    latest = json.loads(svc.owners.latest_state(session_id, agent_id))
    return str(latest["user_id"])
