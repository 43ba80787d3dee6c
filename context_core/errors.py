"""One error hierarchy for the whole platform.

Every error says which resource failed and what the operator can do about it. Driver
errors (redis, qdrant, torch) are wrapped with ``raise ... from e`` so the cause stays visible.

Each class also says, in its own body, how the HTTP service answers it: ``http_status`` and
``error_code`` (the ``"error"`` field of the JSON body). The service has one generic handler
that reads them, so this file is the one place that decides. A new class must set both
itself (``tests/test_service_hardening.py`` enumerates the classes and fails on one that
only inherits them); ``details()`` adds machine-readable fields to the body and
``retry_after_s`` a ``Retry-After`` header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

__all__ = [
    "AccessDeniedError",
    "BackendUnavailableError",
    "BlockedKeywordError",
    "CalibrationError",
    "CollectionNotFoundError",
    "ConfigError",
    "ConfluenceAuthError",
    "ConfluenceFetchError",
    "ContextError",
    "ContextMissError",
    "ContractLockedError",
    "DataValidationError",
    "EmptyExportError",
    "IngestError",
    "InputTooDeepError",
    "InvalidIdError",
    "InvalidStoreRequestError",
    "MassDeleteError",
    "ModelLoadError",
    "ModelMismatchError",
    "PayloadTooLargeError",
    "PersistenceRefusedError",
    "ProfileValidationError",
    "PromotionError",
    "PromptBindingError",
    "PromptTemplateError",
    "QuotaExceededError",
    "ReplicaAckError",
    "SanitizeBudgetExceededError",
    "ScannerLimitError",
    "ScannerUnavailableError",
    "SchemaBehindError",
    "SealedStateError",
    "SessionDataInKnowledgeError",
    "SessionExistsError",
    "StaleStateError",
    "StateTooLargeError",
    "ToolNotApprovedError",
    "UnknownEventError",
    "UnknownSessionError",
    "UnsupportedUploadTypeError",
    "UploadBlockedError",
    "UploadInfectedError",
    "UploadRefusedError",
    "UploadTooLargeError",
    "UploadUnreadableError",
    "VersionConflictError",
]


class ContextError(Exception):
    """Root of every error this platform raises on purpose."""

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "state_conflict"
    retry_after_s: int | None = None

    def details(self) -> dict[str, Any]:
        """Extra fields for the HTTP error body (never the input that caused the error)."""
        return {}


class ConfigError(ContextError):
    """A setting is missing or invalid; the message names the ``CTX_*`` variable."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "server_misconfigured"


class SchemaBehindError(ConfigError):
    """The PostgreSQL schema is not at the code's migration head (behind, never migrated,
    or ahead of this code); the message names the command that fixes it."""

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "schema_behind"


class PromptTemplateError(ConfigError):
    """A prompt template is invalid: found when the templates load (the service refuses to
    start); the message names the file and line and what to change."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "prompt_template_invalid"

    def __init__(self, where: str, line: int | None, problem: str) -> None:
        self.where = where
        self.line = line
        at = f"{where}:{line}" if line else where
        super().__init__(f"prompt template {at}: {problem}")


class PromptBindingError(ContextError):
    """A prompt field whose policy is ``fail`` found no value (or only a low-confidence one)."""

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "prompt_field_unbound"

    def __init__(self, template: str, field: str, layer: str, key: str, why: str) -> None:
        self.template = template
        self.field = field
        self.layer = layer
        self.key = key
        super().__init__(
            f"prompt template {template}: field {field!r} ({layer} {key!r}) {why}, and its "
            "policy is fail; load the value first (or change the field's policy to omit or "
            "notice)"
        )

    def details(self) -> dict[str, Any]:
        return {"field": self.field, "layer": self.layer, "key": self.key}


class BackendUnavailableError(ContextError):
    """Redis/Valkey or Qdrant could not be reached or answered with an error."""

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "backend_unavailable"
    retry_after_s: int | None = 1


class ContextMissError(ContextError, KeyError):
    """An L2 key that a step needs is absent or expired.

    ``key`` is the full Redis key, so the caller can log exactly what was missing.
    """

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "context_miss"

    def __init__(self, key: str, hint: str = "") -> None:
        self.key = key
        msg = f"working-memory miss: {key!r} is absent or expired"
        if hint:
            msg = f"{msg}; {hint}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return str(self.args[0])

    def details(self) -> dict[str, Any]:
        return {"key": self.key}


class VersionConflictError(ContextError):
    """An optimistic-lock write was based on a stale version of a task contract.

    ``current_version`` is the version the contract is at now (re-read, merge, retry on it);
    both versions go into the HTTP error body when known."""

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "version_conflict"

    def __init__(
        self,
        message: str,
        *,
        current_version: int | None = None,
        expected_version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.current_version = current_version
        self.expected_version = expected_version

    def details(self) -> dict[str, Any]:
        out = {"current_version": self.current_version, "expected_version": self.expected_version}
        return {k: v for k, v in out.items() if v is not None}


class ContractLockedError(ContextError):
    """A task contract is locked (e.g. during error recovery) and refuses writes."""

    http_status: ClassVar[int] = 423
    error_code: ClassVar[str] = "contract_locked"


class PersistenceRefusedError(ContextError, TypeError):
    """L1 session state must never be pickled, copied to disk or shared."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "internal_error"


class AccessDeniedError(ContextError, PermissionError):
    """An agent asked for a namespace or session that its ACL does not grant."""

    http_status: ClassVar[int] = 403
    error_code: ClassVar[str] = "forbidden"


class SealedStateError(AccessDeniedError):
    """A sealed L1 state that does not open: malformed, altered, for another organisation or
    session, sealed with a key this service no longer holds, or a signed state after the
    migration window (``context_core.session.seal``)."""

    http_status: ClassVar[int] = 403
    error_code: ClassVar[str] = "state_refused"


class UnknownSessionError(ContextError, LookupError):
    """A session the caller may not see: never created, expired, closed, or another agent's
    (deliberately indistinguishable, so session ids don't leak between agents)."""

    http_status: ClassVar[int] = 404
    error_code: ClassVar[str] = "unknown_session"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is unknown or expired; create it again")
        self.session_id = session_id

    def details(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class SessionExistsError(ContextError):
    """A session id that cannot be taken now, for whatever reason: the caller's own live
    session, another agent's, an id closed recently by another agent, or an id whose L2 data
    exists without an owner. One status, one code, one message for all of them, so that the
    answer never tells a caller that some other agent is using the id (no existence oracle)."""

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "session_id_unavailable"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session id {session_id!r} is not available (in use, closed recently, or holding "
            "data); use another id, or send none and the service makes one"
        )
        self.session_id = session_id

    def details(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class StaleStateError(ContextError):
    """A signed L1 state that is not the session's latest (replayed, superseded by a newer
    one, raced by a concurrent request, or from an earlier incarnation of the session)."""

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "stale_state"

    def __init__(self, message: str, *, session_id: str, current_version: int | None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.current_version = current_version

    def details(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "current_version": self.current_version}


class QuotaExceededError(ContextError):
    """An agent went over one of its quotas; ``retry_after_s`` says when to try again."""

    http_status: ClassVar[int] = 429
    error_code: ClassVar[str] = "quota_exceeded"

    def __init__(self, message: str, *, quota: str, limit: int, retry_after_s: int) -> None:
        super().__init__(message)
        self.quota = quota
        self.limit = limit
        self.retry_after_s = max(1, int(retry_after_s))

    def details(self) -> dict[str, Any]:
        return {"quota": self.quota, "limit": self.limit, "retry_after_s": self.retry_after_s}


class ModelLoadError(ContextError):
    """An embedding model could not be loaded offline."""

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "model_unavailable"
    retry_after_s: int | None = 30


class ModelMismatchError(ContextError):
    """A collection was built with one embedding model and queried with another."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "model_mismatch"


class SessionDataInKnowledgeError(ContextError, ValueError):
    """Someone tried to store session- or user-specific data in L3 knowledge memory."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "session_data_in_knowledge"


class InvalidIdError(ContextError, ValueError):
    """An id (a user id, an organisation id) that has no canonical form: invisible or control
    characters, whitespace inside, scripts mixed as look-alikes do, or over the length limit.

    ``field`` names the id and ``rule`` states the canonical-id rule, so a client can fix it.
    """

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "invalid_id"

    def __init__(self, message: str, *, field: str, rule: str) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule

    def details(self) -> dict[str, Any]:
        return {"field": self.field, "rule": self.rule}


class PayloadTooLargeError(ContextError, ValueError):
    """A payload exceeded a configured size cap.

    ``limit_bytes`` (when known) is the cap; the message names the ``CTX_*`` setting.
    """

    http_status: ClassVar[int] = 413
    error_code: ClassVar[str] = "payload_too_large"

    def __init__(self, message: str, *, limit_bytes: int | None = None) -> None:
        super().__init__(message)
        self.limit_bytes = limit_bytes

    def details(self) -> dict[str, Any]:
        return {} if self.limit_bytes is None else {"limit_bytes": self.limit_bytes}


class StateTooLargeError(PayloadTooLargeError):
    """The signed L1 state an event would produce is over its cap; nothing changed, the
    state the client sent stays valid."""

    http_status: ClassVar[int] = 413
    error_code: ClassVar[str] = "state_too_large"


class SanitizeBudgetExceededError(PayloadTooLargeError):
    """Cleaning an agent's output (:func:`context_core.gateway.output.sanitize_output`)
    took more CPU time than ``CTX_OUTPUT_SANITIZE_BUDGET_MS``; nothing was stored. A shorter
    or simpler output fits (the budget is what one request may cost the service)."""

    http_status: ClassVar[int] = 413
    error_code: ClassVar[str] = "output_sanitize_budget_exceeded"
    setting: ClassVar[str] = "CTX_OUTPUT_SANITIZE_BUDGET_MS"

    def __init__(self, budget_ms: float) -> None:
        super().__init__(
            f"sanitizing the output took more than {budget_ms:g} ms of CPU time "
            f"({self.setting}); send a shorter or simpler output"
        )
        self.budget_ms = budget_ms

    def details(self) -> dict[str, Any]:
        return {"limit_ms": self.budget_ms, "setting": self.setting}


class InputTooDeepError(ContextError, ValueError):
    """A value is nested deeper than the platform processes (hostile or broken input)."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "input_too_deep"


class DataValidationError(ContextError, ValueError):
    """A data-quality gate (Great Expectations suite) failed; nothing was written.

    ``failures`` lists human-readable descriptions naming the failing rows/fields.
    """

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "data_validation_failed"

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        self.failures = list(failures or [])
        detail = "".join(f"\n  - {f}" for f in self.failures[:20])
        more = f"\n  ... and {len(self.failures) - 20} more" if len(self.failures) > 20 else ""
        super().__init__(f"{message}{detail}{more}")


class IngestError(ContextError):
    """An ingestion source could not be read at all (a bad page is quarantined instead)."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "ingest_failed"


class EmptyExportError(IngestError):
    """An export yielded no readable page: a wrong or half-mounted path. Nothing was written.

    A refresh that reads nothing must never be taken for "every page was deleted".
    """

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "empty_export"


class MassDeleteError(IngestError):
    """A refresh would delete more than the allowed share of a space's pages; nothing written.

    ``would_delete`` and ``in_scope`` are page counts; re-run with ``--allow-deletes`` (DAG param
    ``allow_deletes``) when the deletions are intended.
    """

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "mass_delete_refused"

    def __init__(self, message: str, *, would_delete: int, in_scope: int) -> None:
        self.would_delete = would_delete
        self.in_scope = in_scope
        super().__init__(message)


class ConfluenceFetchError(IngestError):
    """Confluence could not be read (network, 5xx storm, request budget spent, bad answer).

    Raised before the sync writes or deletes anything: the collection stays as it was.
    """

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "confluence_unavailable"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status  # the HTTP status that ended the request, when there was one
        super().__init__(message)


class ConfluenceAuthError(ConfluenceFetchError):
    """Confluence refused the credentials (401) or the space (403); the run stops at once.

    The message names the setting to fix (``CTX_CONFLUENCE_USER`` / ``CTX_CONFLUENCE_TOKEN``)
    or, for 403, the space permission the account lacks; it never holds the token.
    """

    http_status: ClassVar[int] = 500  # the deployment's credentials: a misconfiguration
    error_code: ClassVar[str] = "confluence_auth_failed"


class UnknownEventError(ContextError, ValueError):
    """A lifecycle event name that the platform does not define."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "unknown_event"


class CalibrationError(ContextError, ValueError):
    """Thresholds could not be derived from the labelled data with the chosen criterion.

    The message names the criterion and the target that was not reachable.
    """

    http_status: ClassVar[int] = 500
    error_code: ClassVar[str] = "calibration_failed"


class PromotionError(ContextError):
    """A calibration version cannot be promoted, shown or rolled back as asked.

    The message names the version (or the missing history) and what to do instead.
    """

    http_status: ClassVar[int] = 409
    error_code: ClassVar[str] = "calibration_promotion"


class CollectionNotFoundError(ContextError, LookupError):
    """A vector-store collection was used before it was created (run the ingestion first)."""

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "collection_missing"
    retry_after_s: int | None = 30


class InvalidStoreRequestError(ContextError, ValueError):
    """A filter, point id or vector handed to the vector store is malformed."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "invalid_store_request"


class ProfileValidationError(ContextError, ValueError):
    """A profile field is invalid; ``issues`` name each field (``loc``), what is wrong and
    what is allowed (``msg``), as request validation errors do."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "invalid_request"

    def __init__(self, issues: Sequence[Mapping[str, Any]]) -> None:
        self.issues = [dict(i) for i in issues]
        text = "; ".join(
            f"{'.'.join(str(p) for p in i['loc']) or 'profile'}: {i['msg']}" for i in self.issues
        )
        super().__init__(f"invalid compliance profile: {text}")


class ToolNotApprovedError(ContextError, PermissionError):
    """A tool call for a tool outside the session's ``approved_tools``; nothing was applied."""

    http_status: ClassVar[int] = 403
    error_code: ClassVar[str] = "tool_not_approved"

    def __init__(self, tool: str, approved: Sequence[str], *, org_id: str, version: str) -> None:
        allowed = ", ".join(approved) if approved else "none (every tool is forbidden)"
        super().__init__(
            f"tool {tool!r} is not in the approved_tools of the compliance profile of org "
            f"{org_id!r} (version {version}); approved tools: {allowed}"
        )
        self.tool, self.approved, self.org_id, self.version = tool, list(approved), org_id, version

    def details(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "approved_tools": self.approved,
            "org_id": self.org_id,
            "profile_version": self.version,
        }


class BlockedKeywordError(ContextError, ValueError):
    """Text holds a keyword of the profile's ``blocked_keywords``; nothing was written.
    ``loc`` names the offending field (e.g. ``("answers", 0, "text")``)."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "invalid_request"

    def __init__(self, keyword: str, loc: Sequence[str | int], *, org_id: str) -> None:
        where = ".".join(str(p) for p in loc) or "text"
        super().__init__(
            f"{where} contains the blocked keyword {keyword!r} (blocked_keywords of the "
            f"compliance profile of org {org_id!r}); remove it and retry"
        )
        self.keyword, self.loc, self.org_id = keyword, tuple(loc), org_id

    @property
    def issues(self) -> list[dict[str, Any]]:
        return [{"loc": list(self.loc), "msg": str(self), "type": "blocked_keyword"}]


class ReplicaAckError(BackendUnavailableError):
    """A write reached the master but fewer replicas than ``CTX_REDIS_MIN_REPLICAS``
    acknowledged it within ``CTX_REDIS_REPLICA_WAIT_MS``: not durable, so not acknowledged
    (a 503; the write may still be on the master, and retrying it is safe)."""

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "backend_unavailable"


class ScannerUnavailableError(ContextError):
    """The malware scanner could not give a verdict (unreachable, timed out, failed): the
    upload is refused, never stored unscanned. Retry after ``retry_after_s``."""

    http_status: ClassVar[int] = 503
    error_code: ClassVar[str] = "scanner_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))

    def details(self) -> dict[str, Any]:
        return {"retry_after_s": self.retry_after_s}


class ScannerLimitError(PayloadTooLargeError):
    """clamd refused the stream as longer than its ``StreamMaxLength``: a retry cannot help,
    the file is too big for this scanner (413)."""

    http_status: ClassVar[int] = 413

    error_code: ClassVar[str] = "payload_too_large"


class UploadTooLargeError(PayloadTooLargeError):
    """The file (or the text it yields) is over its limit (413)."""

    http_status: ClassVar[int] = 413
    error_code: ClassVar[str] = "payload_too_large"


class UnsupportedUploadTypeError(ContextError, ValueError):
    """Neither the declared content type nor the extension is one of :data:`ALLOWED_TYPES`."""

    http_status: ClassVar[int] = 415
    error_code: ClassVar[str] = "unsupported_media_type"

    def __init__(self, message: str, *, declared: str, allowed: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.declared = declared
        self.allowed = sorted(allowed)

    def details(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "declared": self.declared}


class UploadRefusedError(ContextError, ValueError):
    """The file was scanned or read and refused; it is quarantined (``quarantine_id``, None
    when keeping it failed) and nothing was written to L3 (422)."""

    http_status: ClassVar[int] = 422
    error_code: ClassVar[str] = "upload_refused"
    reason_kind: ClassVar[str] = "refused"

    def __init__(self, message: str, *, quarantine_id: str | None = None) -> None:
        super().__init__(message)
        self.quarantine_id = quarantine_id

    def fields(self) -> dict[str, str]:
        """What the quarantine line and the answer name besides the message."""
        return {}

    def details(self) -> dict[str, Any]:
        return {"reason": self.reason_kind, "quarantine_id": self.quarantine_id, **self.fields()}


class UploadInfectedError(UploadRefusedError):
    """The scanner found ``signature`` in the file. 422 rather than 451: the refusal is about
    the content the client sent (like a blocked keyword), not a legal demand on a resource."""

    http_status: ClassVar[int] = 422

    error_code: ClassVar[str] = "upload_infected"
    reason_kind: ClassVar[str] = "infected"

    def __init__(self, message: str, *, signature: str, quarantine_id: str | None = None) -> None:
        super().__init__(message, quarantine_id=quarantine_id)
        self.signature = signature

    def fields(self) -> dict[str, str]:
        return {"signature": self.signature}


class UploadBlockedError(UploadRefusedError):
    """The file holds one of the organisation's blocked keywords (named: the list is the
    organisation's own, not the file's content)."""

    http_status: ClassVar[int] = 422

    error_code: ClassVar[str] = "upload_blocked"
    reason_kind: ClassVar[str] = "blocked_keyword"

    def __init__(self, message: str, *, keyword: str, quarantine_id: str | None = None) -> None:
        super().__init__(message, quarantine_id=quarantine_id)
        self.keyword = keyword

    def fields(self) -> dict[str, str]:
        return {"keyword": self.keyword}


class UploadUnreadableError(UploadRefusedError):
    """The file could not be read as its type says (damaged, encrypted, binary, no text)."""

    http_status: ClassVar[int] = 422

    error_code: ClassVar[str] = "upload_unreadable"
    reason_kind: ClassVar[str] = "unreadable"
