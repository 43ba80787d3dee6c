"""The task contract: ``GET``/``PUT /v1/sessions/{id}/contract`` (with ``?since_version``
for polling agents, an optimistic lock for writers) and ``GET .../contract/history``."""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Annotated, Any

from fastapi import Query
from fastapi.responses import Response

from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import (
    ContractHistoryResponse,
    ContractResponse,
    ContractUnchangedResponse,
    ContractUpdateRequest,
    ErrorResponse,
)
from context_app.service.routes._common import (
    ERRORS,
    EVENT_ERRORS,
    PathSessionId,
    resource_router,
    wire_response,
)
from context_core.errors import ContextMissError
from context_core.working_memory.contract_sync import contract_since

__all__ = ["router"]

router = resource_router()

SinceVersion = Annotated[
    int | None,
    Query(
        ge=0,
        description="the contract version the caller holds: while the contract is still at "
        'it, the answer is {"session_id", "version", "changed": false} (one HGET in Redis); '
        "any other version answers the contract in full",
    ),
]

PUT_ERRORS = {
    **EVENT_ERRORS,
    409: {
        "model": ErrorResponse,
        "description": "version_conflict: the write was based on a stale version "
        "(the body names current_version and expected_version); nothing was written",
    },
}


@router.get(
    "/v1/sessions/{session_id}/contract",
    tags=["sessions"],
    response_model=ContractResponse | ContractUnchangedResponse,
    responses=ERRORS,
)
def get_contract(
    session_id: PathSessionId, svc: Svc, who: Who, since_version: SinceVersion = None
) -> Response:
    """The current task contract with a content hash (used to check nothing was lost), its
    status (active, expired after a timeout, completed) and the seconds it has left.

    With ``?since_version=N`` (polling agents): while the contract is still at version
    ``N`` the answer is 200 ``{"session_id", "version": N, "changed": false}``, read with
    one ``HGET`` of the version (besides the ownership check); otherwise the contract in
    full, as without the parameter."""
    svc.owners.check(session_id, who.agent_id)
    sm = svc.wm.session(session_id)
    if since_version is None:
        contract = sm.contract()
    else:
        found = contract_since(sm, since_version)
        if found is None:
            return wire_response(
                ContractUnchangedResponse(
                    session_id=session_id, version=since_version, changed=False
                )
            )
        contract = found
    ttl: float | None = None
    if contract.version:
        with contextlib.suppress(ContextMissError):
            ttl = sm.ttl(sm.key("contract", "current"))
    return wire_response(_contract_out(session_id, contract, ttl))


@router.put(
    "/v1/sessions/{session_id}/contract",
    tags=["sessions"],
    response_model=ContractResponse,
    responses=PUT_ERRORS,
)
def put_contract(
    session_id: PathSessionId,
    body: ContractUpdateRequest,
    svc: Svc,
    who: Who,
    nbytes: BodyBytes,
) -> Response:
    """Write a new contract version based on ``expected_version`` (optimistic lock):
    the fields are merged in (cleaned by the gateway) and the new version is answered.
    A stale ``expected_version`` is 409 ``version_conflict`` naming ``current_version``
    (re-read, redo the change, retry); a locked contract (error recovery) is 423."""
    svc.owners.check(session_id, who.agent_id)
    svc.quotas.charge(who.agent_id, nbytes, session_id=session_id)
    sm = svc.wm.session(session_id)
    contract = sm.update_contract(
        body.fields, expected_version=body.expected_version, corrected=body.corrected
    )
    sm.touch()
    return wire_response(_contract_out(session_id, contract, float(sm.wm.contract_ttl_s)))


@router.get(
    "/v1/sessions/{session_id}/contract/history",
    tags=["sessions"],
    response_model=ContractHistoryResponse,
    responses=ERRORS,
)
def get_contract_history(session_id: PathSessionId, svc: Svc, who: Who) -> ContractHistoryResponse:
    """Every version of the task contract, oldest first (kept for audit for
    ``CTX_WM_CONTRACT_HISTORY_TTL_S`` after its last write, 30 days by default)."""
    svc.owners.check(session_id, who.agent_id)
    history = svc.wm.session(session_id).contract_history()
    return ContractHistoryResponse(
        session_id=session_id, versions=[_contract_out(session_id, c) for c in history]
    )


def _contract_out(session_id: str, c: Any, ttl_s: float | None = None) -> ContractResponse:
    canon = json.dumps(
        {"version": c.version, "fields": c.fields}, sort_keys=True, separators=(",", ":")
    )
    return ContractResponse(
        session_id=session_id,
        version=c.version,
        fields=c.fields,
        corrected=c.corrected,
        locked=c.locked,
        status=c.status,
        ttl_s=ttl_s,
        sha256=hashlib.sha256(canon.encode()).hexdigest(),
    )
