"""What every part of a session view shares: its session id, key building, and the client.

:class:`SessionMemory` is assembled from mixins, one per concern (:mod:`.index` for the key
index, :mod:`.contract` for the task contract, :mod:`.lifetime` for activity and timeout,
:mod:`.memory` for the values). They all derive from :class:`SessionBase`, which holds the
only state a view has, so the slots are declared once and every mixin sees the same
attributes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from context_core.errors import AccessDeniedError, ContextError
from context_core.working_memory.keys import (
    canonical,
    check_ident,
    check_kind,
    check_sid,
    expired_key,
    index_key,
    session_prefix,
)

if TYPE_CHECKING:
    from context_core.gateway.sanitize import Gateway
    from context_core.working_memory.store import Store

__all__ = ["SessionBase", "expired_key", "index_key"]


class SessionBase:
    """One session's identity: validated id, key prefix, index and expired-set names."""

    __slots__ = ("_exp", "_gw", "_idx", "_prefix", "_r", "_sid", "wm")

    def __init__(self, wm: Store, session_id: str) -> None:
        self._sid = check_sid(session_id)
        self.wm = wm
        self._prefix = session_prefix(session_id)
        self._idx = index_key(self._prefix)
        self._exp = expired_key(self._prefix)
        # Any: redis-py's stubs type replies as bytes | str whatever decode_responses says.
        self._r: Any = wm._client
        self._gw: Gateway = wm._gateway

    @property
    def session_id(self) -> str:
        return self._sid

    @property
    def index_key(self) -> str:
        """``wm:{<sid>}:index``: the Set listing this session's keys (see :mod:`.index`)."""
        return self._idx

    @property
    def expired_key(self) -> str:
        """``wm:{<sid>}:expired``: keys of this session a sweep found expired."""
        return self._exp

    def __repr__(self) -> str:
        return f"SessionMemory(session_id={self._sid!r}, url={self.wm.url!r})"

    # ---- keys ---------------------------------------------------------------------------
    def key(self, kind: str, ident: str) -> str:
        """``wm:{<sid>}:<kind>:<ident>``, after validating ``kind`` and ``ident``."""
        return f"{self._prefix}{check_kind(kind)}:{check_ident(ident)}"

    def api_key(self, endpoint: str, params: Mapping[str, Any]) -> str:
        """Key of an API response: sha256 of endpoint + canonical JSON of the params."""
        if not isinstance(endpoint, str) or not endpoint:
            raise ContextError("api_key: endpoint must be a non-empty string")
        digest = hashlib.sha256((endpoint + canonical(dict(params))).encode()).hexdigest()
        return f"{self._prefix}api:{digest}"

    def _own(self, key: str) -> str:
        if not isinstance(key, str) or not key.startswith(self._prefix):
            raise AccessDeniedError(
                f"key {key!r} does not belong to session {self.session_id!r}; a session "
                "reads only its own wm:{<sid>}: keys"
            )
        return key

    def _ttl(self, ttl_s: int | None) -> int:
        t = self.wm.default_ttl_s if ttl_s is None else int(ttl_s)
        if t <= 0:
            raise ContextError(f"ttl_s must be positive, got {ttl_s}")
        return t

    def _contract_keys(self) -> tuple[str, str]:
        return self.key("contract", "current"), self.key("contract", "history")
