"""Shared-state sync over HTTP: the task contract as a service client sees it.

The library's :class:`~context_core.working_memory.contract_sync.ContractPoller` polls
Redis; an agent that only talks to the service gives it an :class:`HttpContractSource`
instead, which asks ``GET /v1/sessions/{id}/contract?since_version=N`` (answered
``{"changed": false}`` while the contract is still at ``N``, the contract in full otherwise):

    with httpx.Client(base_url=url, headers={"X-API-Key": key}) as http:
        source = HttpContractSource(http, session_id)
        with ContractPoller(source, since_version=1, on_change=print):
            ...

:func:`put_contract` writes a new version based on the one read (409 ``version_conflict``
names the current version; it raises :class:`VersionConflictError` with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from context_core.errors import ContextError, ContractLockedError, VersionConflictError
from context_core.working_memory.contract import TaskContract

__all__ = ["HttpContractSource", "put_contract"]


def _contract(body: Mapping[str, Any]) -> TaskContract:
    return TaskContract(
        version=int(body["version"]),
        fields=dict(body["fields"]),
        corrected=bool(body.get("corrected", False)),
        locked=bool(body.get("locked", False)),
        status=str(body.get("status") or "active"),
    )


def _refused(r: httpx.Response, what: str) -> ContextError:
    try:
        body = r.json()
    except ValueError:
        body = {}
    detail = body.get("detail", r.text[:300]) if isinstance(body, dict) else r.text[:300]
    if r.status_code == 409 and isinstance(body, dict) and body.get("error") == "version_conflict":
        return VersionConflictError(
            str(detail),
            current_version=body.get("current_version"),
            expected_version=body.get("expected_version"),
        )
    if r.status_code == 423:
        return ContractLockedError(str(detail))
    return ContextError(f"{what} answered {r.status_code}: {detail}")


class HttpContractSource:
    """One session's contract through the service (a
    :class:`~context_core.working_memory.contract_sync.ContractSource`). ``client`` carries
    the base URL and the ``X-API-Key``."""

    def __init__(self, client: httpx.Client, session_id: str) -> None:
        self.client = client
        self._sid = session_id
        self.path = f"/v1/sessions/{session_id}/contract"

    @property
    def session_id(self) -> str:
        return self._sid

    def changed_since(self, since_version: int | None) -> TaskContract | None:
        params = {} if since_version is None else {"since_version": since_version}
        r = self.client.get(self.path, params=params)
        if r.status_code != 200:
            raise _refused(r, f"GET {self.path}")
        body = r.json()
        if body.get("changed") is False:
            return None
        return _contract(body)


def put_contract(
    client: httpx.Client,
    session_id: str,
    fields: Mapping[str, Any],
    *,
    expected_version: int,
    corrected: bool = False,
) -> TaskContract:
    """``PUT /v1/sessions/{id}/contract``: the version written, or
    :class:`VersionConflictError` (``current_version`` set) when ``expected_version`` is
    stale, :class:`ContractLockedError` when the contract is locked."""
    path = f"/v1/sessions/{session_id}/contract"
    r = client.put(
        path,
        json={"expected_version": expected_version, "fields": dict(fields), "corrected": corrected},
    )
    if r.status_code != 200:
        raise _refused(r, f"PUT {path}")
    return _contract(r.json())
