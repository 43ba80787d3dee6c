"""Shared namespaces: context several agents may read, guarded by an ACL of agents + purposes.

Private working memory (``wm:{<sid>}:...``) is never read across sessions. Some context is
legitimately shared, e.g. a fleet's vibration baselines that every diagnostics agent needs. It
lives in a named namespace with its own TTL, and each read must name the agent *and* the
purpose it reads for; both must be granted by the namespace's ACL.

Redis layout (the ``{<name>}`` hash tag keeps a namespace in one cluster slot):

* ``ns:{<name>}:meta`` - hash: ``ttl_s``, ``created_at``. No expiry (configuration).
* ``ns:{<name>}:acl``  - hash: agent id -> JSON ``{"purposes": [...], "write": bool}``.
  A purpose of ``"*"`` grants every purpose. No expiry.
* ``ns:{<name>}:kv:<key>`` - JSON ``{"v": value, "stored_at": epoch}``, expiring after the
  namespace's TTL (or a per-write TTL).

On a Redis Cluster: :meth:`NamespaceRegistry.create`'s MULTI touches only ``meta`` and
``acl`` of one namespace (one slot); :meth:`NamespaceRegistry.drop` SCANs every master (the
cluster client's ``scan_iter`` walks each primary) and deletes keys of that one slot; the ACL
marker is a key of its own. Namespace writes are not waited for by ``CTX_REDIS_MIN_REPLICAS``
(shared context, re-written by its owners; L2 and the service's session records are).

Every write passes the sanitize gateway. Every denial raises :class:`AccessDeniedError` *and*
appends an audit line to ``<data_dir>/audit/access.jsonl`` (agent, purpose, namespace, key,
reason; never the value), so a misbehaving agent leaves evidence even if it swallows errors.

ACLs live in Redis only, so a Redis restart (or FLUSHDB) loses them. :class:`AclSync` keeps a
fixed set of grants (the service's API keys file) present: it writes them with a marker key
(``ns:_acl-synced:<grants digest>``, outside every namespace's hash tag); a registry it is
attached to checks the marker before an ACL read, at most once per ``interval_s``; a missing
marker means the server lost its data, and the grants are written again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.concurrency import blocking
from context_core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    ConfigError,
    ContextMissError,
)
from context_core.fsutil import append_line
from context_core.redis.connection import REDIS_ERRORS, RedisClient
from context_core.redis.ops import Cmd, Op, cmd, ok, run

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.gateway.sanitize import Gateway
    from context_core.redis.connection import RedisProvider

__all__ = [
    "ACL_MARKER_KEY",
    "AccessRecord",
    "AclSync",
    "Grant",
    "GrantSpec",
    "NamespaceRegistry",
    "NsEntry",
]

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ANY_PURPOSE = "*"
#: Written with every ACL sync; its absence means Redis restarted empty or was flushed.
ACL_MARKER_KEY = "ns:_acl-synced"


@dataclass(frozen=True, slots=True)
class Grant:
    """What one agent may do in one namespace."""

    purposes: frozenset[str]
    write: bool = False

    def allows(self, purpose: str) -> bool:
        return ANY_PURPOSE in self.purposes or purpose in self.purposes

    def to_json(self) -> str:
        return json.dumps({"purposes": sorted(self.purposes), "write": self.write})

    @classmethod
    def from_json(cls, raw: str) -> Grant:
        d = json.loads(raw)
        return cls(purposes=frozenset(d.get("purposes", ())), write=bool(d.get("write", False)))


@dataclass(frozen=True, slots=True)
class NsEntry:
    """A value read from a namespace, with what the router needs for provenance."""

    namespace: str
    key: str
    redis_key: str
    value: Any
    stored_at: float
    ttl_s: float | None


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One audited denial: who asked, for what, why it was refused. Never the value."""

    ts: float
    op: str
    namespace: str
    key: str
    agent_id: str | None
    purpose: str
    reason: str


class NamespaceRegistry:
    """Create namespaces, manage their ACLs, and read/write their keys on Redis."""

    def __init__(
        self,
        client: RedisClient,
        gateway: Gateway,
        *,
        audit_path: Path | None = None,
        default_ttl_s: int = 3600,
    ) -> None:
        self._r = client
        self._gateway = gateway
        self._audit_path = audit_path
        self._default_ttl_s = default_ttl_s
        self._audit_lock = threading.Lock()
        self._recent: deque[AccessRecord] = deque(maxlen=256)
        self.acl_sync: AclSync | None = None

    def keep_synced(self, sync: AclSync | None) -> None:
        """Check ``sync`` (re-writing its grants if Redis lost them) before ACL reads."""
        self.acl_sync = sync

    def _check_sync(self) -> None:
        sync = self.acl_sync
        if sync is not None and sync.due():  # on the service's loop: on a worker thread
            blocking(sync.check)

    @classmethod
    def from_settings(
        cls, settings: Settings, provider: RedisProvider, gateway: Gateway
    ) -> NamespaceRegistry:
        return cls(
            provider.client(decode_responses=True),
            gateway,
            audit_path=settings.data_dir / "audit" / "access.jsonl",
        )

    # --- keys -------------------------------------------------------------------------
    @staticmethod
    def _check_name(name: str) -> str:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ConfigError(
                f"namespace name {name!r} is invalid: use 1-64 characters from "
                "letters, digits, '_', '.', '-' (no braces or colons)"
            )
        return name

    @staticmethod
    def _check_key(key: str) -> str:
        if not isinstance(key, str) or not key or any(c in key for c in "{}*?[] \n"):
            raise ConfigError(
                f"namespace key {key!r} is invalid: non-empty, no spaces, braces or glob chars"
            )
        return key

    def kv_key(self, name: str, key: str) -> str:
        return f"ns:{{{self._check_name(name)}}}:kv:{self._check_key(key)}"

    def _meta_key(self, name: str) -> str:
        return f"ns:{{{self._check_name(name)}}}:meta"

    def _acl_key(self, name: str) -> str:
        return f"ns:{{{self._check_name(name)}}}:acl"

    # --- administration ---------------------------------------------------------------
    def create(
        self, name: str, *, ttl_s: int | None = None, acl: Mapping[str, Grant] | None = None
    ) -> None:
        """Create (or reconfigure) a namespace; ``acl`` entries are added, never removed."""
        ttl = int(ttl_s or self._default_ttl_s)
        if ttl <= 0:
            raise ConfigError(f"namespace {name!r}: ttl_s must be positive, got {ttl}")
        try:
            pipe = self._r.pipeline(transaction=True)
            pipe.hset(self._meta_key(name), mapping={"ttl_s": ttl, "created_at": time.time()})
            for agent, grant in (acl or {}).items():
                pipe.hset(self._acl_key(name), agent, grant.to_json())
            pipe.execute()
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"could not create namespace {name!r}: {e}") from e

    def grant(
        self, name: str, agent_id: str, purposes: Iterable[str], *, write: bool = False
    ) -> None:
        self._require_exists(name)
        grant = Grant(purposes=frozenset(purposes), write=write)
        self._r.hset(self._acl_key(name), agent_id, grant.to_json())

    def revoke(self, name: str, agent_id: str) -> None:
        self._r.hdel(self._acl_key(name), agent_id)

    def acl(self, name: str) -> dict[str, Grant]:
        self._check_sync()
        raw: dict[str, str] = self._r.hgetall(self._acl_key(name))  # type: ignore[assignment]
        return {str(agent): Grant.from_json(str(v)) for agent, v in raw.items()}

    def ttl_s(self, name: str) -> int:
        raw = self._r.hget(self._meta_key(name), "ttl_s")
        if raw is None:
            raise ConfigError(f"namespace {name!r} does not exist; create it first")
        return int(raw)

    def exists(self, name: str) -> bool:
        return bool(self._r.exists(self._meta_key(name)))

    def drop(self, name: str) -> int:
        """Delete the namespace, its ACL and every key in it (SCAN on its hash tag)."""
        pattern = f"ns:{{{self._check_name(name)}}}:*"
        keys = list(self._r.scan_iter(match=pattern, count=500))
        return int(self._r.delete(*keys)) if keys else 0

    def _require_exists(self, name: str) -> None:
        if not self.exists(name):
            raise ConfigError(f"namespace {name!r} does not exist; create it first")

    # --- access -----------------------------------------------------------------------
    def _authorize(self, op: str, name: str, key: str, agent_id: str | None, purpose: str) -> None:
        raw: str | None = None
        if agent_id and purpose:
            self._check_sync()
            raw = self._r.hget(self._acl_key(name), agent_id)  # type: ignore[assignment]
        self._decide(op, name, key, agent_id, purpose, raw)

    def _decide(
        self, op: str, name: str, key: str, agent_id: str | None, purpose: str, raw: str | None
    ) -> None:
        """Refuse (audited :class:`AccessDeniedError`) unless ``raw``, the agent's ACL entry
        of ``name`` (None: not in the ACL), grants ``purpose`` (and writing, for a write)."""
        reason = ""
        if not agent_id:
            reason = "no agent id given"
        elif not purpose:
            reason = "no purpose declared"
        elif raw is None:
            reason = f"agent {agent_id!r} is not in the ACL"
        else:
            grant = Grant.from_json(str(raw))
            if not grant.allows(purpose):
                reason = f"purpose {purpose!r} not granted (granted: {sorted(grant.purposes)})"
            elif op == "write" and not grant.write:
                reason = "agent has no write grant"
        if reason:
            rec = AccessRecord(time.time(), op, name, key, agent_id, purpose, reason)
            self._audit(rec)
            raise AccessDeniedError(
                f"{op} of namespace {name!r} key {key!r} denied for agent {agent_id!r} "
                f"(purpose {purpose!r}): {reason}; ask the namespace owner for a grant"
            )

    def write(
        self,
        name: str,
        key: str,
        value: Any,
        *,
        agent_id: str,
        purpose: str,
        ttl_s: int | None = None,
    ) -> str:
        """Store a gateway-cleaned value; returns the Redis key."""
        rkey = self.kv_key(name, key)
        ttl = int(ttl_s or self.ttl_s(name))
        self._authorize("write", name, key, agent_id, purpose)
        clean = self._gateway.clean(value, where=rkey)
        doc = json.dumps({"v": clean, "stored_at": time.time()}, ensure_ascii=False)
        try:
            self._r.set(rkey, doc, ex=ttl)
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"could not write {rkey}: {e}") from e
        return rkey

    def read_entry(self, name: str, key: str, *, agent_id: str | None, purpose: str) -> NsEntry:
        """Read one key after the ACL check; a miss raises ``ContextMissError``."""
        try:
            return run(self._r, self.read_entry_op(name, key, agent_id=agent_id, purpose=purpose))
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"could not read {self.kv_key(name, key)}: {e}") from e

    def read_entry_op(
        self, name: str, key: str, *, agent_id: str | None, purpose: str
    ) -> Op[NsEntry]:
        """Operation (:mod:`context_core.redis.ops`): :meth:`read_entry` in one round (see
        :meth:`entry_read`)."""
        wanted, decide = self.entry_read(name, key, agent_id=agent_id, purpose=purpose)
        return decide(ok((yield wanted)))

    def entry_read(
        self, name: str, key: str, *, agent_id: str | None, purpose: str
    ) -> tuple[list[Cmd], Callable[[list[Any]], NsEntry]]:
        """:meth:`read_entry` split for a caller that sends the commands with its own round
        trip: the commands (the agent's ACL entry and the value, read together) and the
        function that takes their replies and decides. Nothing is decided, audited or
        returned until that function runs; when the ACL refuses, the value read is dropped
        unseen (the refusal is audited as always)."""
        rkey = self.kv_key(name, key)
        wanted = [cmd("GET", rkey), cmd("PTTL", rkey)]
        asks = bool(agent_id and purpose)
        if asks:
            self._check_sync()
            wanted.insert(0, cmd("HGET", self._acl_key(name), agent_id))

        def decide(replies: list[Any]) -> NsEntry:
            grant = replies[0] if asks else None
            self._decide("read", name, key, agent_id, purpose, grant)
            raw, pttl = replies[-2:]
            if raw is None:
                raise ContextMissError(rkey, f"shared namespace {name!r} has no (live) key {key!r}")
            doc = json.loads(raw)
            ttl = None if pttl is None or pttl < 0 else pttl / 1000.0
            return NsEntry(name, key, rkey, doc["v"], float(doc["stored_at"]), ttl)

        return wanted, decide

    def read(self, name: str, key: str, agent_id: str | None, purpose: str) -> Any:
        """The value only; see :meth:`read_entry` for provenance."""
        return self.read_entry(name, key, agent_id=agent_id, purpose=purpose).value

    # --- audit ------------------------------------------------------------------------
    def _audit(self, rec: AccessRecord) -> None:
        # key, agent and purpose come from requests: they pass the gateway like any value
        rec = replace(
            rec,
            key=self._clean(rec.key),
            agent_id=None if rec.agent_id is None else self._clean(rec.agent_id),
            purpose=self._clean(rec.purpose),
            reason=self._clean(rec.reason),
        )
        self._recent.append(rec)
        log.warning(
            "namespace access denied: op=%s ns=%s key=%s agent=%s purpose=%s (%s)",
            rec.op,
            rec.namespace,
            rec.key,
            rec.agent_id,
            rec.purpose,
            rec.reason,
        )
        if self._audit_path is None:
            return
        line = json.dumps({"event": "ns_access_denied", **asdict(rec)}) + "\n"
        with self._audit_lock:
            append_line(self._audit_path, line)

    def _clean(self, text: str) -> str:
        return self._gateway.clean_text(str(text), where="ns.audit")

    @property
    def recent_denials(self) -> tuple[AccessRecord, ...]:
        return tuple(self._recent)


# --- keeping configured grants present ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrantSpec:
    """One grant an operator configured (e.g. in the API keys file)."""

    namespace: str
    agent_id: str
    purposes: tuple[str, ...] = (ANY_PURPOSE,)
    write: bool = False


class AclSync:
    """Keeps ``grants`` in Redis across restarts and flushes of the server.

    :meth:`sync` creates missing namespaces, writes every grant, then sets the marker
    (``marker_key`` + ``:`` + a digest of the grants). :meth:`check` (cheap: one EXISTS, at
    most once per ``interval_s`` and only in one thread at a time) re-syncs when the marker is
    gone. A check that fails (Redis down) is repeated on the next call, so the grants come back
    with the server. ``on_resync`` runs after every re-sync (not after the first sync); its
    errors are logged.
    """

    def __init__(
        self,
        registry: NamespaceRegistry,
        grants: Iterable[GrantSpec],
        *,
        interval_s: float = 5.0,
        marker_key: str = ACL_MARKER_KEY,
        on_resync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.grants = tuple(grants)
        self.interval_s = max(0.0, float(interval_s))
        # one marker per grant set: instances with different keys files each notice the loss
        digest = hashlib.sha256(repr(sorted(map(repr, self.grants))).encode()).hexdigest()[:12]
        self.marker_key = f"{marker_key}:{digest}"
        self.on_resync = on_resync
        self._clock = clock
        self._next = 0.0
        self._lock = threading.Lock()
        self.resyncs = 0

    def sync(self) -> int:
        """Write every grant (creating missing namespaces) and the marker; returns how many."""
        reg = self.registry
        for g in self.grants:
            if not reg.exists(g.namespace):
                reg.create(g.namespace)
            reg.grant(g.namespace, g.agent_id, g.purposes, write=g.write)
        reg._r.set(self.marker_key, json.dumps({"at": time.time(), "grants": len(self.grants)}))
        self._next = self._clock() + self.interval_s
        return len(self.grants)

    def due(self) -> bool:
        """True when :meth:`check` would look at Redis (at most once per ``interval_s``)."""
        return self._clock() >= self._next

    def check(self, *, force: bool = False) -> bool:
        """Re-sync if Redis lost the marker; True when it did. Never raises for Redis errors."""
        if not force and self._clock() < self._next:
            return False
        if not self._lock.acquire(blocking=force):
            return False  # another thread is checking right now
        try:
            if not force and self._clock() < self._next:
                return False
            try:
                present = bool(self.registry._r.exists(self.marker_key))
                if present:
                    self._next = self._clock() + self.interval_s
                    return False
                log.warning(
                    "namespace ACL marker %s is gone (Redis restarted empty or was flushed); "
                    "re-writing %d configured grants",
                    self.marker_key,
                    len(self.grants),
                )
                self.sync()
            except (*REDIS_ERRORS, BackendUnavailableError) as e:
                self._next = 0.0  # check again on the next call
                log.debug("namespace ACL check failed: %s", e)
                return False
            self.resyncs += 1
            if self.on_resync is not None:
                try:
                    self.on_resync()
                except Exception as e:  # the grants are back; a hook failure is only logged
                    log.warning("after the ACL re-sync: %s: %s", type(e).__name__, e)
            return True
        finally:
            self._lock.release()
