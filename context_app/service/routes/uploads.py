"""``POST /v1/uploads``: a user's file (PDF, HTML, text, Markdown) into the uploader's hot
knowledge, after a clamd malware scan, the organisation's blocked keywords and the DLP.

The request is ``multipart/form-data`` with the file in ``file`` (its part's
``Content-Type``, or the extension when that is missing or ``application/octet-stream``,
says how to read it) and two optional fields: ``section`` (the payload field routes filter
on, default ``general``) and ``namespace`` (a shared namespace to write under, granted only
with a ``write`` grant there; otherwise the upload stays in the agent's private scope).
Everything else is :func:`context_core.ingest.upload.scan_and_ingest`; the answers:

* 201 :class:`UploadResponse`: indexed (chunks, point ids, scope, expiry, redactions);
* 413 over ``CTX_UPLOAD_MAX_BYTES`` (or clamd's own stream limit); 415 a type that is not
  allowed (the answer lists the allowed ones);
* 422 refused and quarantined: ``upload_infected`` (names the signature),
  ``upload_blocked`` (names the keyword), ``upload_unreadable``; or a form field invalid;
* 503 ``scanner_unavailable`` + ``Retry-After``: no clamd configured, unreachable or too
  slow (``CTX_CLAMD_TIMEOUT_S``). Fail closed: nothing is stored unscanned;
* 401, and 429 when the upload's bytes go over the agent's per-minute write budget.

The body is a file, not JSON, and bigger than ``CTX_MAX_BODY_BYTES``: the app gives the body
guard (:class:`~context_app.service.middleware.BodyLimit`) :func:`upload_raw_bodies`, which lets
this one route through with its own limit (the file limit plus the multipart envelope) and no
JSON checks; every other route is guarded exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import File, Form, UploadFile
from fastapi.responses import Response

from context_app.service.deps import Services
from context_app.service.errors_map import json_response
from context_app.service.http_deps import Svc, Who
from context_app.service.middleware import RawBody
from context_app.service.models import (
    ErrorResponse,
    UnsupportedTypeResponse,
    UploadRefusedResponse,
    UploadResponse,
    ValidationErrorResponse,
    error_responses,
)
from context_app.service.routes._common import resource_router
from context_core.access.auth import AgentKey
from context_core.config import Settings
from context_core.ingest.clamd import ClamdScanner
from context_core.ingest.upload import parse_keywords, scan_and_ingest

__all__ = [
    "UPLOAD_PATH",
    "blocked_keywords_for",
    "router",
    "scanner_for",
    "upload_raw_bodies",
]

router = resource_router()

UPLOAD_PATH = "/v1/uploads"
MULTIPART_ENVELOPE = 64 * 1024
"""Bytes a multipart body may have beyond the file: boundaries, part headers, form fields."""

SECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # context_core.access.namespaces' names


def blocked_keywords_for(svc: Services, who: AgentKey) -> Sequence[str]:
    """The keywords an upload by ``who`` must not contain: the ``blocked_keywords`` of the
    compliance profile of the agent's organisation, plus ``CTX_BLOCKED_KEYWORDS`` (for every
    organisation). An upload belongs to no session and so to no user: the org's list."""
    org = svc.compliance.get(who.org).profile.blocked_keywords or []
    return parse_keywords([*org, *parse_keywords(svc.settings.blocked_keywords)])


def scanner_for(settings: Settings) -> ClamdScanner | None:
    """The clamd client of ``CTX_CLAMD_URL`` (None when unset: uploads are then refused)."""
    if not settings.clamd_url:
        return None
    return ClamdScanner(settings.clamd_url, timeout_s=settings.clamd_timeout_s)


def upload_raw_bodies(settings: Settings) -> dict[tuple[str, str], RawBody]:
    """What :class:`BodyLimit` must let through to the upload route: the file limit
    (``CTX_UPLOAD_MAX_BYTES``) plus the multipart envelope, with no JSON checks; every other
    route keeps the JSON limits."""
    return {
        ("POST", UPLOAD_PATH): RawBody(
            settings.upload_max_bytes, "CTX_UPLOAD_MAX_BYTES", MULTIPART_ENVELOPE
        )
    }


UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    **error_responses(401, 413, 429),
    415: {"model": UnsupportedTypeResponse, "description": "a type uploads may not have"},
    422: {
        "model": UploadRefusedResponse | ValidationErrorResponse,
        "description": "refused and quarantined (malware, blocked keyword, unreadable), or "
        "an invalid form field",
    },
    503: {
        "model": ErrorResponse,
        "description": "the malware scanner is not configured, unreachable or too slow "
        "(scanner_unavailable), or the service is overloaded; see Retry-After",
    },
}


@router.post(
    UPLOAD_PATH,
    status_code=201,
    tags=["knowledge"],
    response_model=UploadResponse,
    responses=UPLOAD_ERRORS,
)
def upload(
    svc: Svc,
    who: Who,
    file: Annotated[UploadFile, File(description="the file: PDF, HTML, text or Markdown")],
    section: Annotated[
        str, Form(pattern=SECTION_PATTERN, description="payload section routes filter on")
    ] = "general",
    namespace: Annotated[
        str | None,
        Form(
            pattern=NAMESPACE_PATTERN,
            description="shared namespace to write under (needs a write grant there; "
            "otherwise the agent's private scope)",
        ),
    ] = None,
) -> Response:
    """Scan (clamd), read, check blocked keywords, redact and index one file; see the
    module doc for every answer. Nothing reaches L3 unless every check passed."""
    data = file.file.read()
    svc.quotas.charge(who.agent_id, len(data))
    result = scan_and_ingest(
        data,
        file.filename or "",
        file.content_type,
        scanner=scanner_for(svc.settings),
        gateway=svc.gateway,
        knowledge=svc.knowledge,
        blocked_keywords=blocked_keywords_for(svc, who),
        agent_id=who.agent_id,
        namespace=namespace,
        namespaces=svc.namespaces,
        section=section,
    )
    return json_response(result.to_dict(), 201)
