"""What one service instance holds for its lifetime, built once in the app's lifespan.

Redis clients here fail fast on purpose (0.5 s connect, 1 s read, one immediate retry): a
request that finds Redis down must come back as a 503 within about a second, never hang in
the driver's default back-off.
"""

from __future__ import annotations

import logging
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from context_core.config import Settings
from context_core.errors import AccessDeniedError, BackendUnavailableError
from context_core.service.auth import KeyStore
from context_core.service.metrics import ServiceMetrics

__all__ = [
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


def fail_fast_client(url: str, *, decode_responses: bool = True) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_connect_timeout=0.5,
        socket_timeout=1.0,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
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

    def count(self, *args: Any, **kwargs: Any) -> int:
        time.sleep(self.delay_s)
        return int(self._inner.count(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class OwnerBinding:
    """``svc:{<sid>}:owner`` -> agent id: which agent a session belongs to.

    Set once at creation (SET NX) and refreshed on every use (GETEX), so a second agent
    presenting the same session id is refused even with a validly signed state.
    """

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self._r = client
        self.ttl_s = ttl_s

    @staticmethod
    def key(session_id: str) -> str:
        return f"svc:{{{session_id}}}:owner"

    def claim(self, session_id: str, agent_id: str) -> None:
        try:
            ok = self._r.set(self.key(session_id), agent_id, nx=True, ex=self.ttl_s)
            owner = None if ok else self._r.get(self.key(session_id))
        except redis.RedisError as e:
            raise BackendUnavailableError(f"Redis failed while creating session: {e}") from e
        if not ok:
            if owner == agent_id:
                raise SessionExistsError(session_id)
            raise AccessDeniedError(f"session {session_id!r} belongs to another agent")

    def check(self, session_id: str, agent_id: str) -> None:
        try:
            owner = self._r.getex(self.key(session_id), ex=self.ttl_s)
        except redis.RedisError as e:
            raise BackendUnavailableError(f"Redis failed while checking session owner: {e}") from e
        if owner is None:
            raise UnknownSessionError(session_id)
        if owner != agent_id:
            raise AccessDeniedError(f"session {session_id!r} belongs to another agent")

    def release(self, session_id: str) -> None:
        try:
            self._r.delete(self.key(session_id))
        except redis.RedisError as e:
            raise BackendUnavailableError(f"Redis failed while closing session: {e}") from e


class UnknownSessionError(LookupError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is unknown or expired; create it again")
        self.session_id = session_id


class SessionExistsError(Exception):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists; close it or use another id")
        self.session_id = session_id


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
    from context_core.confidence import ConfidencePolicy
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

    provider = RedisProvider(settings)
    opened: list[Any] = [provider]
    try:
        client = fail_fast_client(provider.url)
        opened.append(client)
        try:
            client.ping()
        except redis.RedisError as e:
            raise BackendUnavailableError(
                f"Redis at {provider.url} did not answer PING ({e}); fix CTX_REDIS_URL"
            ) from e
        gateway = Gateway.from_settings(settings)
        wm = WorkingMemory(
            client,
            gateway,
            default_ttl_s=settings.wm_default_ttl_s,
            series_window=settings.wm_series_window,
            min_ttl_s=settings.wm_min_ttl_s,
        )
        store = open_store(settings)
        opened.append(store)
        if settings.fault_slow_l3_ms > 0:
            log.warning("fault drill: every L3 call sleeps %.0f ms", settings.fault_slow_l3_ms)
            store = SlowStore(store, settings.fault_slow_l3_ms)
        bin_client = fail_fast_client(provider.url, decode_responses=False)
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
            policy=ConfidencePolicy.load(settings),
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
        sync_grants(namespaces, keys.agents)
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
            lifecycle=LifecycleManager(wm=wm, gateway=gateway, knowledge=knowledge),
            keys=keys,
            owners=OwnerBinding(client, ttl_s=2 * settings.wm_default_ttl_s),
            metrics=ServiceMetrics(),
            state_key=load_state_key(client),
        )
    except BaseException:
        for obj in reversed(opened):
            try:
                obj.close()
            except Exception as e:
                log.warning("cleanup after a failed start: %s", e)
        raise


def sync_grants(namespaces: Any, agents: Sequence[Any]) -> None:
    """Mirror the keys file's namespace/purpose lists into the namespaces' Redis ACLs.

    The keys file is the operator's statement of who may read what; the namespace ACL is
    where the router checks it. A ``"*"`` namespace entry grants nothing here (namespaces are
    not enumerated); name the namespaces an agent needs.
    """
    for agent in agents:
        for ns in agent.namespaces:
            if ns == "*":
                continue
            if not namespaces.exists(ns):
                namespaces.create(ns)
            namespaces.grant(ns, agent.agent_id, agent.purposes or ("*",))
