"""What one service instance holds for its lifetime, built once in the app's lifespan.

Redis clients here fail fast on purpose (``CTX_SERVICE_REDIS_TIMEOUT_S`` and
``CTX_SERVICE_REDIS_CONNECT_TIMEOUT_S``, 0.15 s each; one immediate retry on a broken
connection, none on a timeout): a request that finds Redis down *or hung* must come back as a
503 within about a quarter second, never wait out the driver's default back-off.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from context_app.service.metrics import ServiceMetrics
from context_app.service.owners import AgentQuotas, OwnerBinding
from context_core.access.auth import KeyStore
from context_core.concurrency import blocking
from context_core.errors import (
    BackendUnavailableError,
    ConfigError,
    SessionExistsError,
    UnknownSessionError,
)
from context_core.knowledge.store import search_batch
from context_core.platform import Platform, build_platform, fail_fast_client
from context_core.redis.connection import (
    REDIS_ERRORS,
    RedisClient,
    is_cluster_client,
    make_async_twin,
)
from context_core.redis.ops import Op, attach_async, detach_async, run_all
from context_core.session.seal import StateCodec, StateKeyring

if TYPE_CHECKING:
    from context_core.access.auth import AgentKey
    from context_core.access.compliance import ComplianceStore
    from context_core.access.namespaces import AclSync, NamespaceRegistry
    from context_core.config import Settings
    from context_core.gateway.sanitize import Gateway
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.knowledge.store import (
        CollectionInfo,
        Filter,
        Hit,
        IndexStatus,
        PointRecord,
        SearchQuery,
        SparseVector,
        Vector,
        VectorStore,
    )
    from context_core.lifecycle.manager import LifecycleManager
    from context_core.redis.connection import RedisProvider
    from context_core.routing.intents import IntentRegistry
    from context_core.routing.router import ContextRouter
    from context_core.traces import TraceWriter
    from context_core.working_memory import WorkingMemory

__all__ = [
    "AgentQuotas",
    "OwnerBinding",
    "Services",
    "SessionExistsError",
    "SlowStore",
    "UnknownSessionError",
    "build_services",
    "fail_fast_client",
]

log = logging.getLogger(__name__)

STATE_KEY = "svc:state-signing-key"
SEAL_KEY = "svc:state-seal-key"
"""Without CTX_STATE_KEYS: the AES-256 key (base64url) sealing L1 on the wire, key id ``auto``,
created once (SET NX) and shared by every instance on this Redis."""
AUTO_KID = "auto"


class SlowStore:
    """Fault drill (``CTX_FAULT_SLOW_L3_MS``): the real store, with a real sleep before every
    search/count, so the router's L3 timeout and degraded path run for real."""

    def __init__(self, inner: VectorStore, delay_ms: float) -> None:
        self._inner = inner
        self.delay_s = delay_ms / 1000.0

    def search(
        self, vector: Vector, query: SearchQuery, sparse: SparseVector | None = None
    ) -> list[Hit]:
        blocking(time.sleep, self.delay_s)
        return self._inner.search(vector, query, sparse)

    def search_batch(
        self, vector: Vector, queries: Sequence[SearchQuery], sparse: SparseVector | None = None
    ) -> list[list[Hit] | Exception]:
        blocking(time.sleep, self.delay_s * len(queries))  # one per search, as if sent one by one
        return search_batch(self._inner, vector, queries, sparse=sparse)

    def count(self, name: str, *, filter: Filter | None = None) -> int:
        blocking(time.sleep, self.delay_s)
        return int(self._inner.count(name, filter=filter))

    # --- the rest of the store protocol, undelayed ----------------------------------------
    def create_collection(
        self, name: str, *, dim: int, model: str, sparse: str | None = None
    ) -> None:
        self._inner.create_collection(name, dim=dim, model=model, sparse=sparse)

    def enable_sparse(self, name: str, sparse: str) -> None:
        self._inner.enable_sparse(name, sparse)

    def set_sparse(self, name: str, points: Sequence[tuple[str, SparseVector]]) -> None:
        self._inner.set_sparse(name, points)

    def drop_collection(self, name: str) -> None:
        self._inner.drop_collection(name)

    def info(self, name: str) -> CollectionInfo | None:
        return self._inner.info(name)

    def upsert(self, name: str, points: Sequence[PointRecord]) -> None:
        self._inner.upsert(name, points)

    def delete(
        self, name: str, *, ids: Sequence[str] | None = None, filter: Filter | None = None
    ) -> None:
        self._inner.delete(name, ids=ids, filter=filter)

    def scroll(
        self,
        name: str,
        *,
        filter: Filter | None = None,
        with_vectors: bool = False,
        batch: int = 256,
    ) -> Iterator[PointRecord]:
        return self._inner.scroll(name, filter=filter, with_vectors=with_vectors, batch=batch)

    def retrieve(
        self, name: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[PointRecord]:
        return self._inner.retrieve(name, ids, with_vectors=with_vectors)

    def optimize(self, name: str) -> IndexStatus:
        return self._inner.optimize(name)

    def close(self) -> None:
        self._inner.close()


def load_state_key(client: RedisClient) -> bytes:
    """The HMAC key signing L1 on the wire, shared by every instance through Redis."""
    return _shared_key(client, STATE_KEY, secrets.token_hex(32), "state-signing key").encode()


def _shared_key(client: RedisClient, name: str, fresh: str, what: str) -> str:
    """The value at ``name``: ``fresh`` when no instance set it before (SET NX, then GET)."""
    try:
        client.set(name, fresh, nx=True)
        raw = client.get(name)
    except REDIS_ERRORS as e:
        raise BackendUnavailableError(
            f"could not read the {what} from Redis ({e}); check CTX_REDIS_URL"
        ) from e
    if raw is None:  # pragma: no cover - SET NX then GET on one server
        raise BackendUnavailableError(f"{what} vanished from Redis; retry")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


_warned_auto_key = False


def load_seal_keyring(client: RedisClient, settings: Settings) -> StateKeyring:
    """The keys sealing L1 on the wire: CTX_STATE_KEYS when set; else one random AES-256 key
    shared by every instance through Redis (``svc:state-seal-key``, key id ``auto``), with a
    warning (logged once per process, never the key) that rotation needs CTX_STATE_KEYS."""
    global _warned_auto_key
    if settings.state_keys is not None:
        return StateKeyring.from_settings(settings)
    fresh = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    entry = _shared_key(client, SEAL_KEY, fresh, "state-sealing key")
    if not _warned_auto_key:
        _warned_auto_key = True
        log.warning(
            "CTX_STATE_KEYS is not set: L1 states are sealed with a random key kept in Redis "
            "(%s, key id %r); set CTX_STATE_KEYS to rotate keys (docs/security.md)",
            SEAL_KEY,
            AUTO_KID,
        )
    return auto_keyring(entry)


def auto_keyring(entry: str) -> StateKeyring:
    """The keyring of the automatic key, from the value of ``svc:state-seal-key``."""
    try:
        key = base64.urlsafe_b64decode(entry + "=" * (-len(entry) % 4))
    except (binascii.Error, ValueError) as e:
        raise ConfigError(
            f"{SEAL_KEY} in Redis is not base64url ({e}); delete it to let the service make a "
            "new one (states sealed with it are then refused), or set CTX_STATE_KEYS"
        ) from e
    return StateKeyring(AUTO_KID, {AUTO_KID: key})


@dataclass(eq=False)
class Services:
    """Everything the endpoints use: the library's :class:`Platform` and the service's own
    parts. ``close`` releases the platform (last opened first).

    The platform's parts are also plain attributes here (``svc.router``, ``svc.wm``, ...),
    copied once at start, so the request path reads them with one attribute lookup.
    """

    platform: Platform
    keys: KeyStore
    owners: OwnerBinding
    metrics: ServiceMetrics
    state_key: bytes = field(repr=False)  # the HMAC key: never in a repr
    quotas: AgentQuotas
    codec: StateCodec  # seals L1 for the wire, opens it (and signed states until the window)
    settings: Settings = field(init=False)
    provider: RedisProvider = field(init=False)
    redis: RedisClient = field(init=False)
    redis_bin: RedisClient = field(init=False)  # raw bytes: the query-embedding cache
    gateway: Gateway = field(init=False)
    wm: WorkingMemory = field(init=False)
    store: VectorStore = field(init=False)
    knowledge: KnowledgeMemory = field(init=False)
    router: ContextRouter = field(init=False)
    tracer: TraceWriter = field(init=False)
    namespaces: NamespaceRegistry = field(init=False)
    registry: IntentRegistry = field(init=False)
    lifecycle: LifecycleManager = field(init=False)
    compliance: ComplianceStore = field(init=False)
    #: True while the hot endpoints run on the event loop (:mod:`.execution`): set by
    #: :meth:`start_loop`, cleared by :meth:`stop_loop`.
    on_loop: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        p = self.platform
        self.settings = p.settings
        self.provider = p.provider
        self.redis = p.redis
        self.redis_bin = p.redis_bin
        self.gateway = p.gateway
        self.wm = p.wm
        self.store = p.store
        self.knowledge = p.knowledge
        self.router = p.router
        self.tracer = p.tracer
        self.namespaces = p.namespaces
        self.registry = p.registry
        self.lifecycle = p.lifecycle
        self.compliance = p.compliance

    def intents(self) -> list[str]:
        return list(self.registry.names())

    def start_loop(self) -> bool:
        """Run the hot endpoints on the event loop (``CTX_SERVICE_EXECUTION=loop``): give the
        Redis client its asynchronous twin. Call on the loop that serves requests. False
        (threads, logged once) for ``threads`` or a Redis Cluster."""
        if self.settings.service_execution != "loop":
            return False
        if is_cluster_client(self.redis):
            log.info("Redis Cluster: the endpoints run on worker threads (no event-loop twin)")
            return False
        attach_async(self.redis, make_async_twin(self.redis))
        self.on_loop = True
        return True

    async def stop_loop(self) -> None:
        """Back to threads; the twin's connections closed (on the loop that used them)."""
        self.on_loop = False
        twin = detach_async(self.redis)
        if twin is not None:
            await twin.aclose()

    def run(
        self, ops: Sequence[Op[object]], what: str, *, return_exceptions: bool = False
    ) -> list[object]:
        """Run operations of several parts (quotas, owners, L2) on the service's Redis client
        in shared round trips (:func:`context_core.redis.ops.run_all`); a Redis failure is a
        :class:`BackendUnavailableError` naming ``what``."""
        try:
            return run_all(
                self.redis,
                ops,
                min_replicas=self.settings.redis_min_replicas,
                wait_ms=self.settings.redis_replica_wait_ms,
                return_exceptions=return_exceptions,
            )
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while {what}: {e}") from e

    def close(self) -> None:
        self.platform.close()


def _fault_drill(settings: Settings) -> Callable[[VectorStore], VectorStore] | None:
    if settings.fault_slow_l3_ms <= 0:
        return None

    def slow(store: VectorStore) -> VectorStore:
        log.warning("fault drill: every L3 call sleeps %.0f ms", settings.fault_slow_l3_ms)
        return SlowStore(store, settings.fault_slow_l3_ms)

    return slow


def build_services(settings: Settings, *, echo_dev_key: bool = True) -> Services:
    """Open every backend the service needs. Heavy (loads the embedding model).

    The platform's Redis clients fail fast (``fail_fast_redis``); the service's own parts
    share its text client.
    """
    platform = build_platform(
        settings, fail_fast_redis=True, wrap_store=_fault_drill(settings), eager=True
    )
    try:
        client = platform.redis
        if settings.api_keys_file is not None:
            keys = KeyStore.load(settings.api_keys_file)
        else:
            keys, raw = KeyStore.dev_default()
            if echo_dev_key:
                print(
                    "ctx serve: no CTX_API_KEYS_FILE; dev key for agent "
                    f"'{keys.agents[0].agent_id}' (shown once): X-API-Key: {raw}",
                    file=sys.stderr,
                    flush=True,
                )
        state_key = load_state_key(client)
        keyring = load_seal_keyring(client, settings)
        metrics = ServiceMetrics()

        def after_resync() -> None:  # Redis restarted empty or was flushed
            metrics.acl_resyncs.inc()
            restore_state_key(client, state_key)
            if settings.state_keys is None:
                restore_seal_key(client, keyring)

        sync_grants(
            platform.namespaces,
            keys.agents,
            interval_s=settings.acl_check_interval_s,
            on_resync=after_resync,
        )
        return Services(
            platform=platform,
            keys=keys,
            # a session's identity lives as long as its task contract can
            owners=OwnerBinding(
                client,
                ttl_s=_session_ttl_s(settings),
                min_replicas=settings.redis_min_replicas,
                replica_wait_ms=settings.redis_replica_wait_ms,
            ),
            metrics=metrics,
            state_key=state_key,
            quotas=AgentQuotas(
                client,
                max_sessions=settings.max_live_sessions_per_agent,
                max_bytes_per_min=settings.max_write_bytes_per_agent_per_min,
                session_ttl_s=2 * settings.wm_default_ttl_s,
            ),
            codec=StateCodec.from_settings(settings, legacy_key=state_key, keyring=keyring),
        )
    except BaseException:
        platform.close()
        raise


def _session_ttl_s(settings: Settings) -> int:
    """How long a service session's owner record and signed state outlive its last request:
    as long as its task contract (``CTX_WM_CONTRACT_TTL_S``), never less than twice the L2
    default."""
    return max(2 * settings.wm_default_ttl_s, settings.wm_contract_ttl_s)


def sync_grants(
    namespaces: NamespaceRegistry,
    agents: Sequence[AgentKey],
    *,
    interval_s: float = 5.0,
    on_resync: Callable[[], None] | None = None,
) -> AclSync:
    """Mirror the keys file's namespace/purpose lists into the namespaces' Redis ACLs, and
    keep them there: the returned :class:`AclSync` is attached to ``namespaces``, which
    re-writes the grants when Redis restarts empty or is flushed (checked at most once per
    ``interval_s``).

    The keys file is the operator's statement of who may read what; the namespace ACL is
    where the router checks it. A ``"*"`` namespace entry grants nothing here (namespaces are
    not enumerated); name the namespaces an agent needs.
    """
    from context_core.access.namespaces import AclSync, GrantSpec

    grants = [
        GrantSpec(ns, agent.agent_id, tuple(agent.purposes or ("*",)))
        for agent in agents
        for ns in agent.namespaces
        if ns != "*"
    ]
    sync = AclSync(namespaces, grants, interval_s=interval_s, on_resync=on_resync)
    sync.sync()
    namespaces.keep_synced(sync)
    return sync


def restore_state_key(client: RedisClient, key: bytes) -> None:
    """After Redis lost its data: put this instance's state-signing key back (SET NX), so
    instances sharing the server keep agreeing on it; warn when another one won the race."""
    client.set(STATE_KEY, key.decode(), nx=True)
    raw = client.get(STATE_KEY)
    current = raw.encode() if isinstance(raw, str) else raw
    if current != key:
        log.warning(
            "the state-signing key in Redis differs from this instance's after a Redis "
            "restart; restart this instance so all instances sign with the same key"
        )


def restore_seal_key(client: RedisClient, keyring: StateKeyring) -> None:
    """After Redis lost its data: put this instance's automatic sealing key back (SET NX);
    warn when another instance won the race (states it seals would not open here)."""
    mine = base64.urlsafe_b64encode(keyring.keys[AUTO_KID]).decode().rstrip("=")
    if _shared_key(client, SEAL_KEY, mine, "state-sealing key") != mine:
        log.warning(
            "the state-sealing key in Redis differs from this instance's after a Redis "
            "restart; restart this instance so all instances seal with the same key"
        )
