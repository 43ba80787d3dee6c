"""The session itself: ``POST /v1/sessions`` (start), ``GET .../{id}/state`` (its latest
state, sealed), ``DELETE .../{id}`` (close).

Per request, one script in Redis checks that the session is the caller's and that the
state is its latest (:mod:`~context_app.service.owners`): another agent's session answers
exactly like a missing one (404), an old or replayed state is 409 ``stale_state``.
"""

from __future__ import annotations

import contextlib
import uuid

from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.execution import endpoint
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import CloseResponse, CreateSessionRequest, StateResponse
from context_app.service.routes._common import (
    ERRORS,
    PathSessionId,
    agent_auth,
    resource_router,
    sealed_out,
    state_response,
    wire_out,
    wire_response,
)
from context_core.gateway.identity import canonical_user_id
from context_core.redis.ops import Cmd, Op, ok
from context_core.session.wire import WireState

__all__ = ["router"]

router = resource_router()


@router.post(
    "/v1/sessions",
    status_code=201,
    tags=["sessions"],
    response_model=StateResponse,
    responses=ERRORS,
)
@endpoint
def create_session(body: CreateSessionRequest, svc: Svc, who: Who, nbytes: BodyBytes) -> Response:
    """Start a session owned by the calling agent; returns the sealed L1 state. The user
    id is kept in canonical form (NFKC, trimmed, case-folded; 422 ``invalid_id`` naming the
    rule for ids with invisible characters or look-alike script mixes); it names a user
    of the calling agent's organisation. An id that cannot be taken answers 409
    ``session_id_unavailable``, whatever the reason."""
    canonical_user_id(body.user_id)  # refused before anything is claimed
    sid = body.session_id or f"s-{uuid.uuid4().hex}"
    nonce = svc.owners.claim(sid, who.agent_id)
    try:
        svc.quotas.charge(who.agent_id, nbytes, session_id=sid, new_session=True)
    except BaseException:
        svc.owners.release(sid)
        raise
    try:
        # the start's fire-and-forget writes (snapshot, activity, the published state)
        # share round trips with its reads (see WorkingMemory.deferred)
        with svc.wm.deferred():
            result = svc.lifecycle.apply(
                "session_start",
                None,
                session_id=sid,
                user_id=body.user_id,
                user_query=body.user_query,
                auth=agent_auth(who),
                contract=body.contract,
                device_id=body.device_id,
                org_id=who.org,  # the compliance profile snapshot: the agent key's org
            )
            out = wire_out(svc, result.state, 0, nonce, who.org)
            svc.wm.defer(svc.owners.publish_cmd(sid, out.stored.decode()))
    except BaseException:
        _undo_create(svc, sid, who.agent_id)
        raise
    return state_response(out, result.effects, 201)


@router.get(
    "/v1/sessions/{session_id}/state",
    tags=["sessions"],
    response_model=StateResponse,
    responses=ERRORS,
)
def get_state(session_id: PathSessionId, svc: Svc, who: Who) -> Response:
    """The session's latest state, sealed: where a client answered ``stale_state`` (or one
    that lost a response) picks up again."""
    latest = WireState.model_validate_json(svc.owners.latest_state(session_id, who.agent_id))
    out = sealed_out(svc, latest, who.org)
    return state_response(out, {"version": latest.version})


@router.delete(
    "/v1/sessions/{session_id}",
    tags=["sessions"],
    response_model=CloseResponse,
    responses=ERRORS,
)
@endpoint
def close_session(session_id: PathSessionId, svc: Svc, who: Who) -> Response:
    """Close the session: its working memory is deleted now rather than left to expire;
    its states are void (a session created again under the id starts a new incarnation)."""
    svc.owners.check(session_id, who.agent_id)
    n = svc.wm.session(session_id).clear()
    svc.run(  # what is left of the session, in one round trip
        [
            _sent(
                [
                    *svc.wm.forget_activity_cmds(session_id),
                    *svc.owners.release_cmds(session_id, who.agent_id),
                    *svc.quotas.forget_cmds(who.agent_id, session_id),
                ]
            )
        ],
        "closing the session",
    )
    return wire_response({"session_id": session_id, "deleted_keys": n})


def _sent(cmds: list[Cmd]) -> Op[None]:
    """Operation: send ``cmds`` and raise the first error reply."""
    ok((yield cmds))


def _undo_create(svc: Services, session_id: str, agent_id: str) -> None:
    """A creation failed after the claim: drop what it wrote, then free the id."""
    for undo in (
        lambda: svc.wm.session(session_id).clear(),
        lambda: svc.owners.release(session_id),
        lambda: svc.quotas.forget(agent_id, session_id),
    ):
        with contextlib.suppress(Exception):  # the client must hear the original error
            undo()
