"""``PUT``/``GET /v1/sessions/{id}/plan``: the agent's step dependency graph.

Step outputs get the plan's TTLs at once (the ones already written) and when written later,
in any process (:meth:`context_core.working_memory.SessionMemory.apply_plan`). Each request
is session activity: it refreshes the task contract's lifetime and the idle clock.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi.responses import Response

from context_app.service.execution import endpoint
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import PlanRequest, PlanResponse
from context_app.service.routes._common import (
    ERRORS,
    PathSessionId,
    resource_router,
    wire_response,
)
from context_core.errors import ContextMissError
from context_core.working_memory.plan import AnchoredPlan, PlannedStep, StepPlan

__all__ = ["router"]

router = resource_router()


@router.put(
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
    return wire_response({"session_id": session_id, "ttls": ttls, "plan": _plan_out(current, now)})


@router.get(
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
