"""What one service instance holds for its lifetime, built once in the app's lifespan.

Redis clients here fail fast on purpose (``CTX_SERVICE_REDIS_TIMEOUT_S`` and
``CTX_SERVICE_REDIS_CONNECT_TIMEOUT_S``, 0.15 s each; one immediate retry on a broken
connection, none on a timeout): a request that finds Redis down *or hung* must come back as a
503 within about a quarter second, never wait out the driver's default back-off.
"""

from __future__ import annotations

import logging
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from context_app.service.metrics import ServiceMetrics
from context_app.service.owners import AgentQuotas, OwnerBinding
from context_core.auth import KeyStore
from context_core.config import Settings
from context_core.errors import BackendUnavailableError, SessionExistsError, UnknownSessionError

if TYPE_CHECKING:
    from context_core.namespaces import AclSync

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
RedisClient = redis.Redis  # alias: the Services field named ``redis`` shadows the module


def fail_fast_client(
    url: str,
    *,
    decode_responses: bool = True,
    timeout_s: float = 0.15,
    connect_timeout_s: float = 0.15,
) -> redis.Redis:
    """A client for the request path: every command gives up after ``timeout_s``.

    A broken connection (reset by a restarted server) is retried once, immediately, on a new
    connection; a timeout is not retried, since a hung server would just cost the time twice.
    """
    return redis.Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        retry_on_error=[redis.ConnectionError],
        health_check_interval=0,
    )


class SlowStore:
    """Fault drill (``CTX_FAULT_SLOW_L3_MS``): the real store, with a real sleep before every
    search/count, so the router's L3 timeout and degraded path run for real."""

    def __init__(self, inner: Any, delay_ms: float) -> None:
        self._inner = inner
        self.delay_s = delay_ms / 1000.0

    def search(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.delay_s)
        return self._inner.search(*args, **kwargs)

    def search_batch(self, vector: Any, queries: Any) -> list[Any]:
        from context_core.knowledge.store import search_batch

        time.sleep(self.delay_s * len(queries))  # one sleep per search, as if sent one by one
        return search_batch(self._inner, vector, queries)

    def count(self, *args: Any, **kwargs: Any) -> int:
        time.sleep(self.delay_s)
        return int(self._inner.count(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def load_state_key(client: redis.Redis) -> bytes:
    """The HMAC key signing L1 on the wire, shared by every instance through Redis."""
    try:
        client.set(STATE_KEY, secrets.token_hex(32), nx=True)
        raw = client.get(STATE_KEY)
    except redis.RedisError as e:
        raise BackendUnavailableError(
            f"could not read the state-signing key from Redis ({e}); check CTX_REDIS_URL"
        ) from e
    if raw is None:  # pragma: no cover - SET NX then GET on one server
        raise BackendUnavailableError("state-signing key vanished from Redis; retry")
    return raw.encode() if isinstance(raw, str) else bytes(raw)


@dataclass
class Services:
    """Everything the endpoints use; ``close`` releases it in reverse order."""

    settings: Settings
    provider: Any
    redis: RedisClient
    redis_bin: RedisClient  # raw bytes: the query-embedding cache
    gateway: Any
    wm: Any
    store: Any
    knowledge: Any
    router: Any
    tracer: Any
    namespaces: Any
    registry: Any
    lifecycle: Any
    keys: KeyStore
    owners: OwnerBinding
    metrics: ServiceMetrics
    state_key: bytes
    quotas: AgentQuotas

    def intents(self) -> list[str]:
        return list(self.registry.names())

    def close(self) -> None:
        for what, fn in (
            ("router", self.router.close),
            ("trace writer", getattr(self.tracer, "close", None)),
            ("vector store", getattr(self.store, "close", None)),
            ("redis client", self.redis.close),
            ("redis client (bytes)", self.redis_bin.close),
            ("redis provider", self.provider.close),
        ):
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:  # closing must go on for the rest
                log.warning("closing the %s failed: %s", what, e)


def build_services(settings: Settings, *, echo_dev_key: bool = True) -> Services:
    """Open every backend the service needs. Heavy (loads the embedding model)."""
    from context_core.confidence import PolicySource
    from context_core.embedding import load_encoder
    from context_core.gateway import Gateway
    from context_core.intents import IntentRegistry
    from context_core.knowledge import open_store
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.lifecycle import LifecycleManager
    from context_core.namespaces import NamespaceRegistry
    from context_core.redis_conn import RedisProvider
    from context_core.router import ContextRouter
    from context_core.traces import TraceWriter
    from context_core.working_memory import WorkingMemory

    timeout_s = settings.service_redis_timeout_s
    connect_s = settings.service_redis_connect_timeout_s
    provider = RedisProvider(settings, socket_timeout=timeout_s, socket_connect_timeout=connect_s)
    opened: list[Any] = [provider]
    try:
        client = fail_fast_client(provider.url, timeout_s=timeout_s, connect_timeout_s=connect_s)
        opened.append(client)
        try:
            client.ping()
        except redis.RedisError as e:
            raise BackendUnavailableError(
                f"Redis at {provider.safe_url} did not answer PING ({e}); fix CTX_REDIS_URL"
            ) from e
        gateway = Gateway.from_settings(settings)
        wm = WorkingMemory(
            client,
            gateway,
            default_ttl_s=settings.wm_default_ttl_s,
            series_window=settings.wm_series_window,
            min_ttl_s=settings.wm_min_ttl_s,
            max_step_bytes=settings.max_step_result_bytes,
            contract_ttl_s=settings.wm_contract_ttl_s,
            contract_history_ttl_s=settings.wm_contract_history_ttl_s,
            idle_s=settings.session_idle_s,
        )
        store = open_store(settings)
        opened.append(store)
        if settings.fault_slow_l3_ms > 0:
            log.warning("fault drill: every L3 call sleeps %.0f ms", settings.fault_slow_l3_ms)
            store = SlowStore(store, settings.fault_slow_l3_ms)
        bin_client = fail_fast_client(
            provider.url, decode_responses=False, timeout_s=timeout_s, connect_timeout_s=connect_s
        )
        opened.append(bin_client)
        encoder = load_encoder(settings, redis_client=bin_client)
        knowledge = KnowledgeMemory(store, encoder, settings, gateway)
        knowledge.ensure_collections()
        # The first encode pays torch's lazy initialisation (hundreds of ms): pay it here,
        # not in the first request's L3 timeout budget.
        encoder.encode(["service warm-up"])
        tracer = TraceWriter.from_settings(settings, gateway)
        namespaces = NamespaceRegistry(
            client, gateway, audit_path=settings.data_dir / "audit" / "access.jsonl"
        )
        registry = IntentRegistry.builtin()
        router = ContextRouter(
            wm=wm,
            knowledge=knowledge,
            # thresholds.json is re-read on the route after it changes, and refused when it
            # was calibrated for another model than this encoder
            policy=PolicySource(settings, model=encoder.name),
            max_fragments=settings.bundle_max_fragments,
            tracer=tracer,
            namespaces=namespaces,
            registry=registry,
            l3_timeout_ms=settings.l3_timeout_ms,
            l3_collection=settings.collection_main,
        )
        opened.append(router)
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
        metrics = ServiceMetrics()

        def after_resync() -> None:  # Redis restarted empty or was flushed
            metrics.acl_resyncs.inc()
            restore_state_key(client, state_key)

        sync_grants(
            namespaces,
            keys.agents,
            interval_s=settings.acl_check_interval_s,
            on_resync=after_resync,
        )
        return Services(
            settings=settings,
            provider=provider,
            redis=client,
            redis_bin=bin_client,
            gateway=gateway,
            wm=wm,
            store=store,
            knowledge=knowledge,
            router=router,
            tracer=tracer,
            namespaces=namespaces,
            registry=registry,
            lifecycle=LifecycleManager.from_settings(
                settings,
                wm=wm,
                gateway=gateway,
                knowledge=knowledge,
                namespaces=namespaces,
                count_tokens=encoder.count_tokens,  # the embedding model's tokenizer
            ),
            keys=keys,
            # a session's identity lives as long as its task contract can
            owners=OwnerBinding(client, ttl_s=_session_ttl_s(settings)),
            metrics=metrics,
            state_key=state_key,
            quotas=AgentQuotas(
                client,
                max_sessions=settings.max_live_sessions_per_agent,
                max_bytes_per_min=settings.max_write_bytes_per_agent_per_min,
                session_ttl_s=2 * settings.wm_default_ttl_s,
            ),
        )
    except BaseException:
        for obj in reversed(opened):
            try:
                obj.close()
            except Exception as e:
                log.warning("cleanup after a failed start: %s", e)
        raise


def _session_ttl_s(settings: Settings) -> int:
    """How long a service session's owner record and signed state outlive its last request:
    as long as its task contract (``CTX_WM_CONTRACT_TTL_S``), never less than twice the L2
    default."""
    return max(2 * settings.wm_default_ttl_s, settings.wm_contract_ttl_s)


def sync_grants(
    namespaces: Any,
    agents: Sequence[Any],
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
    from context_core.namespaces import AclSync, GrantSpec

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


def restore_state_key(client: redis.Redis, key: bytes) -> None:
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
