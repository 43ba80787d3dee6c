"""The idle sweep: a session nobody touched for ``CTX_SESSION_IDLE_S`` (90 s) is timed out.

Activity is every event, route, plan, confirmation or preference write of a session (each
records it in Redis, :meth:`context_core.working_memory.SessionMemory.touch`), so the sweep
sees the same clock whichever instance served the session. Every
``CTX_IDLE_SWEEP_INTERVAL_S`` each instance tries to take a short Redis lock; the one that
gets it runs :meth:`context_core.lifecycle.manager.LifecycleManager.sweep_idle` (the L2 side of
``session_timeout``: contract marked ``expired`` and kept, every other key deleted) and then
clears the L1 trace of each timed-out service session: the session's latest signed state is
replaced by one with an empty trace and the next version. A client still holding the old
state gets 409 ``stale_state`` and re-fetches the cleared one with
``GET /v1/sessions/{id}/state``; its next event resumes the session (the contract becomes
``active`` again). A session whose write lease is held at that moment (an event in flight)
keeps its L1 state; that event's own activity resumes it.

``ctx session sweep-idle`` runs one sweep from the command line (library sessions without a
service owner are timed out the same way; they have no stored L1 state to clear).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from context_app.service.metrics import ServiceMetrics
from context_app.service.owners import OwnerBinding
from context_core.gateway.sanitize import Gateway
from context_core.lifecycle.manager import LifecycleManager
from context_core.redis.connection import REDIS_ERRORS, RedisClient
from context_core.redis.ops import cmd, execute, ok
from context_core.session.state import ANONYMOUS
from context_core.session.wire import WireState

__all__ = [
    "IDLE_LOCK_KEY",
    "IdleSweep",
    "IdleSweepParts",
    "SweepParts",
    "clear_l1",
    "sweep_idle_once",
]

log = logging.getLogger(__name__)

IDLE_LOCK_KEY = "svc:idle-sweep:lock"

_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class SweepParts(Protocol):
    """What a sweep uses: the service's :class:`~context_app.service.deps.Services` has it,
    and ``ctx sweep-idle`` builds a :class:`IdleSweepParts` from a platform."""

    @property
    def redis(self) -> RedisClient: ...
    @property
    def gateway(self) -> Gateway: ...
    @property
    def owners(self) -> OwnerBinding: ...
    @property
    def state_key(self) -> bytes: ...
    @property
    def lifecycle(self) -> LifecycleManager: ...
    @property
    def metrics(self) -> ServiceMetrics: ...


@dataclass(frozen=True, slots=True)
class IdleSweepParts:
    """The sweep's parts outside the service (``ctx sweep-idle``)."""

    redis: RedisClient
    gateway: Gateway
    owners: OwnerBinding
    state_key: bytes
    lifecycle: LifecycleManager
    metrics: ServiceMetrics


@dataclass
class IdleSweep:
    """What one sweep did."""

    ran: bool
    timed_out: list[str] = field(default_factory=list)
    l1_cleared: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ran": self.ran, "timed_out": self.timed_out, "l1_cleared": self.l1_cleared}


def clear_l1(svc: SweepParts, session_id: str) -> bool:
    """Replace a service session's latest state by one with an empty trace (next version).
    ``False`` when the session has no stored state, it is not signed with this service's
    key, or an event holds its lease / moved it on meanwhile."""
    raw = svc.owners.server_state(session_id)
    if raw is None:
        return False
    wire = WireState.model_validate_json(raw)
    if not wire.verify(svc.state_key):
        log.warning("idle sweep: stored state of a session is not signed with this key; kept")
        return False
    state = wire.to_state(gateway=svc.gateway, auth=ANONYMOUS)
    cleared = state.keep_last_trace_items(0)
    new = WireState.of(cleared, svc.state_key, version=wire.version + 1, nonce=wire.nonce)
    text = json.dumps(new.model_dump(), ensure_ascii=False, separators=(",", ":"))
    return svc.owners.replace_latest(session_id, wire.nonce, wire.version, text) == "ok"


def sweep_idle_once(
    svc: SweepParts, *, now: float | None = None, lock_ms: int = 30_000
) -> IdleSweep:
    """One sweep, if no other instance is running one (Redis lock ``IDLE_LOCK_KEY``)."""
    token = secrets.token_hex(8)
    r = svc.redis
    # its round trips through redis_ops: awaited when the service runs it on its event loop
    (got,) = ok(execute(r, [cmd("SET", IDLE_LOCK_KEY, token, "NX", "PX", lock_ms)]))
    if not got:
        return IdleSweep(ran=False)
    try:
        timed_out = list(svc.lifecycle.sweep_idle(now=now))
        cleared = [sid for sid in timed_out if clear_l1(svc, sid)]
    finally:
        try:
            ok(execute(r, [cmd("EVAL", _RELEASE_LUA, 1, IDLE_LOCK_KEY, token)]))
        except REDIS_ERRORS as e:  # it expires on its own
            log.warning("idle sweep: could not release the lock: %s", e)
    if timed_out:
        svc.metrics.idle_timeouts.inc(len(timed_out))
        log.info("idle sweep: %d session(s) timed out", len(timed_out))
    return IdleSweep(ran=True, timed_out=timed_out, l1_cleared=cleared)
