"""One error hierarchy for the whole platform.

Every error says which resource failed and what the operator can do about it. Driver
errors (redis, qdrant, torch) are wrapped with ``raise ... from e`` so the cause stays visible.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "BackendUnavailableError",
    "CalibrationError",
    "CollectionNotFoundError",
    "ConfigError",
    "ContextError",
    "ContextMissError",
    "ContractLockedError",
    "DataValidationError",
    "EmptyExportError",
    "IngestError",
    "InvalidStoreRequestError",
    "MassDeleteError",
    "ModelLoadError",
    "ModelMismatchError",
    "PayloadTooLargeError",
    "PersistenceRefusedError",
    "SessionDataInKnowledgeError",
    "UnknownEventError",
    "VersionConflictError",
]


class ContextError(Exception):
    """Root of every error this platform raises on purpose."""


class ConfigError(ContextError):
    """A setting is missing or invalid; the message names the ``CTX_*`` variable."""


class BackendUnavailableError(ContextError):
    """Redis/Valkey or Qdrant could not be reached or answered with an error."""


class ContextMissError(ContextError, KeyError):
    """An L2 key that a step needs is absent or expired.

    ``key`` is the full Redis key, so the caller can log exactly what was missing.
    """

    def __init__(self, key: str, hint: str = "") -> None:
        self.key = key
        msg = f"working-memory miss: {key!r} is absent or expired"
        if hint:
            msg = f"{msg}; {hint}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return str(self.args[0])


class VersionConflictError(ContextError):
    """An optimistic-lock write was based on a stale version of a task contract."""


class ContractLockedError(ContextError):
    """A task contract is locked (e.g. during error recovery) and refuses writes."""


class PersistenceRefusedError(ContextError, TypeError):
    """L1 session state must never be pickled, copied to disk or shared."""


class AccessDeniedError(ContextError, PermissionError):
    """An agent asked for a namespace or session that its ACL does not grant."""


class ModelLoadError(ContextError):
    """An embedding model could not be loaded offline."""


class ModelMismatchError(ContextError):
    """A collection was built with one embedding model and queried with another."""


class SessionDataInKnowledgeError(ContextError, ValueError):
    """Someone tried to store session- or user-specific data in L3 knowledge memory."""


class PayloadTooLargeError(ContextError, ValueError):
    """A payload exceeded a configured size cap."""


class DataValidationError(ContextError, ValueError):
    """A data-quality gate (Great Expectations suite) failed; nothing was written.

    ``failures`` lists human-readable descriptions naming the failing rows/fields.
    """

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        self.failures = list(failures or [])
        detail = "".join(f"\n  - {f}" for f in self.failures[:20])
        more = f"\n  ... and {len(self.failures) - 20} more" if len(self.failures) > 20 else ""
        super().__init__(f"{message}{detail}{more}")


class IngestError(ContextError):
    """An ingestion source could not be read at all (a bad page is quarantined instead)."""


class EmptyExportError(IngestError):
    """An export yielded no readable page: a wrong or half-mounted path. Nothing was written.

    A refresh that reads nothing must never be taken for "every page was deleted".
    """


class MassDeleteError(IngestError):
    """A refresh would delete more than the allowed share of a space's pages; nothing written.

    ``would_delete`` and ``in_scope`` are page counts; re-run with ``--allow-deletes`` (DAG param
    ``allow_deletes``) when the deletions are intended.
    """

    def __init__(self, message: str, *, would_delete: int, in_scope: int) -> None:
        self.would_delete = would_delete
        self.in_scope = in_scope
        super().__init__(message)


class UnknownEventError(ContextError, ValueError):
    """A lifecycle event name that the platform does not define."""


class CalibrationError(ContextError, ValueError):
    """Thresholds could not be derived from the labelled data with the chosen criterion.

    The message names the criterion and the target that was not reachable.
    """


class CollectionNotFoundError(ContextError, LookupError):
    """A vector-store collection was used before it was created (run the ingestion first)."""


class InvalidStoreRequestError(ContextError, ValueError):
    """A filter, point id or vector handed to the vector store is malformed."""
