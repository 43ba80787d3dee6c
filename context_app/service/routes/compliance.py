"""Compliance profiles over HTTP (:mod:`context_core.access.compliance`).

* ``GET /v1/compliance/orgs/{org}`` and ``GET .../orgs/{org}/users/{user}``: the stored record
  (version 0 and an empty profile when none was written yet). Any agent of that org.
* ``PUT`` on the same paths: ``{"expected_version": N, "profile": {...}}`` replaces the record
  (optimistic lock: 409 ``version_conflict`` naming ``current_version`` when stale; 422 naming
  each bad field and what it allows). Needs the purpose ``compliance_admin`` in the keys file.
* ``GET .../history``: the audit entries (operator, time, version, SHA-256 of the stored
  data, names of the changed fields; never values), oldest first. ``compliance_admin`` only.

Who belongs to which org: the agent key's ``org`` (keys file, default ``"default"``). An
agent reaches its own org only; another org's paths answer 403.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from fastapi import Path
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from context_app.service.deps import Services
from context_app.service.http_deps import BodyBytes, Svc, Who
from context_app.service.models import error_responses
from context_app.service.routes._common import resource_router, wire_response
from context_core.access.auth import ORG_PATTERN, AgentKey
from context_core.access.compliance import ADMIN_PURPOSE, ComplianceProfile, StoredProfile
from context_core.errors import AccessDeniedError

__all__ = [
    "ComplianceAuditOut",
    "ComplianceHistoryResponse",
    "ComplianceProfileResponse",
    "CompliancePutRequest",
    "ErasureReceiptResponse",
    "router",
]

router = resource_router()

USER_PATTERN = r"^[^\s/{}:]{1,256}$"
PathOrg = Annotated[str, Path(min_length=1, max_length=64, pattern=ORG_PATTERN)]
PathUser = Annotated[str, Path(min_length=1, max_length=256, pattern=USER_PATTERN)]

READ_ERRORS = error_responses(401, 403, 422, 503)
WRITE_ERRORS = {
    **error_responses(401, 403, 413, 422, 429, 503),
    409: {
        "model": error_responses(409)[409]["model"],
        "description": "version_conflict: expected_version is not the stored version (the "
        "body names current_version); nothing was written",
    },
}

TAGS: list[str | Enum] = ["compliance"]
ORG_PATH = "/v1/compliance/orgs/{org_id}"
USER_PATH = ORG_PATH + "/users/{user_id}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompliancePutRequest(_Model):
    expected_version: int = Field(
        ge=0, description="the version this write is based on (0: none stored yet)"
    )
    profile: ComplianceProfile


class ComplianceProfileResponse(_Model):
    org_id: str
    user_id: str | None = Field(description="null: the org's own profile")
    version: int = Field(description="0: nothing stored yet")
    profile: ComplianceProfile
    sha256: str = Field(description="SHA-256 of the stored profile's canonical JSON")
    updated_at: float | None
    updated_by: str | None


class ComplianceAuditOut(_Model):
    org_id: str
    user_id: str | None = Field(description="the user's key id (a hash for ids like e-mails)")
    version: int
    operator: str
    at: float
    sha256: str
    changed: list[str] = Field(description="names of the fields that changed (no values)")


class ComplianceHistoryResponse(_Model):
    org_id: str
    user_id: str | None
    entries: list[ComplianceAuditOut]


class ErasureReceiptResponse(_Model):
    erasure_id: str = Field(description="the erasure's id in the ledger and the audit log")
    at: str = Field(description="when it was recorded (ISO-8601 UTC)")
    org: str
    subject: str = Field(
        description="the user's keyed hash (HMAC-SHA-256; the audit log and ledger hold only it)"
    )
    counts: dict[str, int] = Field(description="records removed per store (no values)")


@router.get(ORG_PATH, tags=TAGS, response_model=ComplianceProfileResponse, responses=READ_ERRORS)
def get_org_profile(org_id: PathOrg, svc: Svc, who: Who) -> Response:
    """The org's compliance profile (any agent of the org)."""
    return _get(svc, who, org_id, None)


@router.put(ORG_PATH, tags=TAGS, response_model=ComplianceProfileResponse, responses=WRITE_ERRORS)
def put_org_profile(
    org_id: PathOrg, body: CompliancePutRequest, svc: Svc, who: Who, nbytes: BodyBytes
) -> Response:
    """Replace the org's profile (``compliance_admin``; optimistic lock on
    ``expected_version``; values cleaned by the gateway; audited)."""
    return _put(svc, who, nbytes, org_id, None, body)


@router.get(
    ORG_PATH + "/history",
    tags=TAGS,
    response_model=ComplianceHistoryResponse,
    responses=READ_ERRORS,
)
def get_org_history(org_id: PathOrg, svc: Svc, who: Who) -> Response:
    """The org profile's audit entries, oldest first (``compliance_admin``)."""
    return _history(svc, who, org_id, None)


@router.get(USER_PATH, tags=TAGS, response_model=ComplianceProfileResponse, responses=READ_ERRORS)
def get_user_profile(org_id: PathOrg, user_id: PathUser, svc: Svc, who: Who) -> Response:
    """A user's overrides (merged into the org's: a user narrows, never widens)."""
    return _get(svc, who, org_id, user_id)


@router.put(USER_PATH, tags=TAGS, response_model=ComplianceProfileResponse, responses=WRITE_ERRORS)
def put_user_profile(
    org_id: PathOrg,
    user_id: PathUser,
    body: CompliancePutRequest,
    svc: Svc,
    who: Who,
    nbytes: BodyBytes,
) -> Response:
    """Replace a user's overrides (``compliance_admin``; as for the org's)."""
    return _put(svc, who, nbytes, org_id, user_id, body)


@router.get(
    USER_PATH + "/history",
    tags=TAGS,
    response_model=ComplianceHistoryResponse,
    responses=READ_ERRORS,
)
def get_user_history(org_id: PathOrg, user_id: PathUser, svc: Svc, who: Who) -> Response:
    """A user's audit entries, oldest first (``compliance_admin``)."""
    return _history(svc, who, org_id, user_id)


@router.post(
    USER_PATH + "/erasure",
    tags=TAGS,
    response_model=ErasureReceiptResponse,
    responses=error_responses(401, 403, 422, 503),
)
def post_user_erasure(org_id: PathOrg, user_id: PathUser, svc: Svc, who: Who) -> Response:
    """Erase everything of this user in the org (``compliance_admin``): preferences,
    compliance profile and history, the user's service sessions with their L2 keys and trace
    lines, hot answers and their merged copies. Answers the receipt: counts per store, the
    user's keyed hash, never values (``ctx erase`` does the same; docs/data-lifecycle.md)."""
    _admin(who, org_id)
    from context_core.governance.erasure import ErasureTarget, erase_user

    target = ErasureTarget.from_settings(
        svc.settings,
        redis=svc.redis,
        compliance=svc.compliance,
        store=svc.store,
        agent_orgs={a.agent_id: a.org for a in svc.keys.agents},
    )
    return wire_response(erase_user(target, org_id, user_id).to_dict())


def _get(svc: Services, who: AgentKey, org_id: str, user_id: str | None) -> Response:
    _member(who, org_id)
    return wire_response(_out(svc.compliance.get(org_id, user_id), user_id))


def _put(
    svc: Services,
    who: AgentKey,
    nbytes: int,
    org_id: str,
    user_id: str | None,
    body: CompliancePutRequest,
) -> Response:
    _admin(who, org_id)
    svc.quotas.charge(who.agent_id, nbytes)
    stored = svc.compliance.put(
        org_id,
        body.profile,
        expected_version=body.expected_version,
        operator=who.agent_id,
        user_id=user_id,
    )
    return wire_response(_out(stored, user_id))


def _history(svc: Services, who: AgentKey, org_id: str, user_id: str | None) -> Response:
    _admin(who, org_id)
    entries = [e.to_dict() for e in svc.compliance.history(org_id, user_id)]
    return wire_response({"org_id": org_id, "user_id": user_id, "entries": entries})


def _member(who: AgentKey, org_id: str) -> None:
    if who.org != org_id:
        raise AccessDeniedError(
            f"agent {who.agent_id!r} belongs to org {who.org!r}, not {org_id!r} (org in the "
            "API keys file)"
        )


def _admin(who: AgentKey, org_id: str) -> None:
    _member(who, org_id)
    if not who.may_declare(ADMIN_PURPOSE):
        raise AccessDeniedError(
            f"agent {who.agent_id!r} may not administer compliance profiles: its purposes in "
            f"the API keys file lack {ADMIN_PURPOSE!r}"
        )


def _out(p: StoredProfile, user_id: str | None) -> dict[str, Any]:
    return {
        "org_id": p.org_id,
        "user_id": user_id,
        "version": p.version,
        "profile": p.profile.model_dump(mode="json"),
        "sha256": p.sha256,
        "updated_at": p.updated_at,
        "updated_by": p.updated_by,
    }
