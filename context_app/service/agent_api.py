"""Session endpoints beyond events and routes: the step plan, user confirmations, preferences.

* ``PUT /v1/sessions/{id}/plan``: the agent's step dependency graph. Step outputs get the
  plan's TTLs at once (the ones already written) and when written later, in any process
  (:meth:`context_core.working_memory.SessionMemory.apply_plan`); ``GET`` returns it.
* ``POST /v1/sessions/{id}/confirmations``: answers the user confirmed, e.g. after a route
  reported ``context_used.fallback`` (the user referred to something taught earlier that L3
  does not hold). They go to hot knowledge right away, cleaned by the gateway and
  trust-scoped exactly like ``goal_achieved``'s answers (the writer is the calling agent).
* ``GET/PUT/DELETE /v1/sessions/{id}/preferences[/{type}]``: the structured preferences of
  the session's user (``pref:{<org>:<uid>}:<type>``). The user is the one the session was
  started for (read from its latest signed state) and the organisation the calling agent's
  API key's, so an agent reaches only the preferences of its own organisation's users whose
  sessions it owns.

Each request is session activity: it refreshes the task contract's lifetime and the idle
clock (:meth:`~context_core.working_memory.SessionMemory.touch`).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import FastAPI, Path
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response

from context_app.service.execution import endpoint
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import (
    ConfirmationRequest,
    ConfirmationResponse,
    PlanRequest,
    PlanResponse,
    PreferenceDeleted,
    PreferenceIn,
    PreferenceSet,
    PreferencesResponse,
    PrefType,
)
from context_app.service.sessions_api import (
    ERRORS,
    PathSessionId,
    _auth,
    _signed_for,
    wire_response,
)
from context_core.errors import ContextMissError
from context_core.working_memory.plan import AnchoredPlan, PlannedStep, StepPlan

__all__ = ["install_agent_routes"]

PathPrefType = Annotated[PrefType, Path()]


def _plan_out(plan: AnchoredPlan | None, now: float) -> dict[str, Any]:
    if plan is None:
        return {}
    return {
        "factor": plan.factor,
        "applied_at": plan.applied_at,
        "steps": {
            sid: {
                "depends_on": list(plan.depends_on.get(sid, ())),
                "starts_in_s": round(start - now, 3),
            }
            for sid, start in plan.start_at.items()
        },
    }


def _pref_dict(p: Any) -> dict[str, Any]:
    return {"value": p.value, "confidence": p.confidence, "last_updated": p.last_updated}


def _user_of(svc: Any, session_id: str, agent_id: str) -> str:
    """The user the session was started for, from its latest signed state (owner-checked)."""
    latest = json.loads(svc.owners.latest_state(session_id, agent_id))
    return str(latest["user_id"])


def install_agent_routes(app: FastAPI) -> None:
    @app.put(
        "/v1/sessions/{session_id}/plan",
        tags=["sessions"],
        response_model=PlanResponse,
        responses=ERRORS,
    )
    @endpoint
    def put_plan(
        session_id: PathSessionId, body: PlanRequest, svc: Svc, who: Who, nbytes: BodyBytes
    ) -> Response:
        """Store the step dependency plan; step outputs' TTLs follow it (see the module doc).
        A step nobody depends on keeps the default TTL; an overdue dependent still finds its
        input for at least ``CTX_WM_MIN_TTL_S``."""
        svc.run(
            [
                svc.owners.access_op("owner", session_id, who.agent_id),
                svc.quotas.charge_op(who.agent_id, nbytes, session_id=session_id),
            ],
            "checking the session owner and quotas",
        )  # the owner's error first, as it is checked first
        plan = StepPlan.of(
            *(PlannedStep(s.step_id, tuple(s.depends_on), float(s.est_start_s)) for s in body.steps)
        )
        sm = svc.wm.session(session_id)
        ttls = sm.apply_plan(plan, factor=float(body.factor))
        with svc.wm.deferred():  # the touch goes with the plan's read
            sm.touch()
            current = sm.current_plan()
        now = time.time()
        return wire_response(
            {"session_id": session_id, "ttls": ttls, "plan": _plan_out(current, now)}
        )

    @app.get(
        "/v1/sessions/{session_id}/plan",
        tags=["sessions"],
        response_model=PlanResponse,
        responses=ERRORS,
    )
    def get_plan(session_id: PathSessionId, svc: Svc, who: Who) -> Response:
        """The stored plan (409 ``context_miss`` when none was sent or it expired), with the
        TTL each existing step output has now."""
        svc.owners.check(session_id, who.agent_id)
        sm = svc.wm.session(session_id)
        plan = sm.current_plan()
        if plan is None:
            raise ContextMissError(sm.key("plan", "current"), "no plan was sent for this session")
        ttls: dict[str, int] = {}
        for step in plan.start_at:
            try:
                ttl = sm.ttl(sm.key("step", step))
            except ContextMissError:
                continue
            if ttl is not None:
                ttls[step] = int(ttl)
        now = time.time()
        return wire_response({"session_id": session_id, "ttls": ttls, "plan": _plan_out(plan, now)})

    @app.post(
        "/v1/sessions/{session_id}/confirmations",
        status_code=201,
        tags=["sessions"],
        response_model=ConfirmationResponse,
        responses=ERRORS,
    )
    def post_confirmations(
        session_id: PathSessionId,
        body: ConfirmationRequest,
        svc: Svc,
        who: Who,
        nbytes: BodyBytes,
    ) -> Response:
        """User-confirmed answers to hot knowledge, now (written as the calling agent). An
        answer holding a blocked keyword of the session's compliance profile is refused
        (422 naming the field and the keyword); nothing is written then."""
        wire = body.state
        _signed_for(svc, wire, session_id)
        svc.quotas.charge(who.agent_id, nbytes, session_id=session_id)
        svc.owners.verify(session_id, who.agent_id, wire.nonce, wire.version)
        state = wire.to_state(gateway=svc.gateway, auth=_auth(who))
        answers = [a.model_dump(exclude_none=True) for a in body.answers]
        confirmed = svc.lifecycle.confirm_answers(state, answers, org_id=who.org)
        svc.wm.session(session_id).touch()
        return wire_response(
            {"session_id": session_id, "confirmed": jsonable_encoder(confirmed)}, 201
        )

    @app.get(
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

    @app.put(
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

    @app.delete(
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
