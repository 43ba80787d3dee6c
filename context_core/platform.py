"""The composition root: the library's parts, wired once from :class:`Settings`.

Every caller (the service, ``ctx`` commands, the demo, the DAG jobs, the health report, the
benchmarks) gets its Redis provider, gateway, L2, L3, router, lifecycle and trace writer from
:func:`build_platform` instead of wiring them by hand, so they are wired the same way
everywhere. Parts are built on first use and then cached, so a caller pays only for what it
touches: ``ctx sweep-idle`` never loads the embedding model, a candidates export never starts
Redis. :meth:`Platform.open` builds everything at once (the service: fail at start, not on
the first request).

A platform owns what it opened: :meth:`Platform.close` (or leaving its ``with`` block) closes
the parts in the reverse order of opening, and :meth:`Platform.open` closes what was already
opened when a later part fails. Building parts is not thread-safe; a platform shared by
threads (the service) is opened first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, cast

import redis

from context_core.config import Settings
from context_core.errors import BackendUnavailableError
from context_core.redis.connection import REDIS_ERRORS, RedisClient, make_client, split_cluster_url

if TYPE_CHECKING:
    from context_core.access.compliance import ComplianceStore
    from context_core.access.namespaces import NamespaceRegistry
    from context_core.gateway.sanitize import Gateway
    from context_core.ingest.hot import MergeSummary
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.knowledge.store import VectorStore
    from context_core.lifecycle.manager import LifecycleManager
    from context_core.redis.connection import RedisProvider
    from context_core.routing.confidence import PolicySource
    from context_core.routing.intents import IntentRegistry
    from context_core.routing.prompts import PromptLibrary
    from context_core.routing.router import ContextRouter
    from context_core.traces import TraceWriter
    from context_core.working_memory import WorkingMemory

__all__ = ["Platform", "build_platform", "fail_fast_client", "run_hot_merge"]

log = logging.getLogger(__name__)

WARM_UP_TEXT = "warm-up"


def fail_fast_client(
    url: str, *, decode_responses: bool = True, timeout_s: float, connect_timeout_s: float
) -> RedisClient:
    """A client for a request path: every command gives up after ``timeout_s``.

    A broken connection (reset by a restarted server) is retried once, immediately, on a new
    connection; a timeout is not retried, since a hung server would just cost the time twice.
    A ``redis+cluster://`` URL gives a cluster client
    (:func:`context_core.redis.connection.make_client`);
    the platform itself asks its provider, which also detects a cluster behind a plain URL.
    """
    return make_client(
        url,
        cluster=split_cluster_url(url)[1],
        decode_responses=decode_responses,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_timeout_s,
        fail_fast=True,
    )


@dataclass(eq=False)
class Platform:
    """The library's parts for one process, each built on first access and then cached.

    Options (fields), each stating what a caller needs:

    * ``with_knowledge``: the router and the lifecycle use L3 (knowledge memory, and the
      embedding model's tokenizer for the L1 budget). False: L1/L2 only; the store and the
      encoder are then opened only if asked for directly.
    * ``fail_fast_redis``: Redis clients give up after ``CTX_SERVICE_REDIS_TIMEOUT_S`` /
      ``CTX_SERVICE_REDIS_CONNECT_TIMEOUT_S`` and are not pooled with the provider's (the
      service's request path); otherwise the provider's relaxed, shared clients.
    * ``embed_cache``: the encoder caches query vectors in Redis (the bytes client).
    * ``ensure_collections``: opening knowledge memory creates both collections (checking the
      recorded model); False for jobs that only read or merge existing ones.
    * ``wrap_store``: applied to the opened vector store (the service's slow-L3 fault drill).
    """

    settings: Settings
    with_knowledge: bool = True
    fail_fast_redis: bool = False
    embed_cache: bool = True
    ensure_collections: bool = True
    wrap_store: Callable[[VectorStore], VectorStore] | None = None
    _opened: list[tuple[str, Callable[[], None]]] = field(
        default_factory=list, init=False, repr=False
    )

    # --- lifetime ----------------------------------------------------------------------------
    def _track(self, what: str, close: Callable[[], None]) -> None:
        self._opened.append((what, close))

    @property
    def opened(self) -> list[str]:
        """What this platform holds open, in opening order (closed in reverse)."""
        return [what for what, _ in self._opened]

    def open(self) -> Platform:
        """Build every part now (the router and the lifecycle pull in the rest) and pay the
        encoder's first-call cost; on any failure close what was opened and re-raise."""
        try:
            # first: a PostgreSQL schema behind the code refuses (naming `ctx db upgrade`)
            # before the model loads
            _ = self.compliance
            _ = self.prompts  # first: an invalid template stops start-up before any backend
            _ = self.router
            _ = self.lifecycle
            if self.with_knowledge:
                self.warm_up()
        except BaseException:
            self.close()
            raise
        return self

    def warm_up(self) -> None:
        """Encode once: the first forward pass of a freshly loaded model pays torch's lazy
        initialisation (hundreds of ms), which must not land in a route's L3 budget."""
        self.encoder.encode([WARM_UP_TEXT])

    def close(self) -> None:
        """Close every opened part, last opened first; a failing close is logged and the rest
        still close. Safe to call twice."""
        while self._opened:
            what, close = self._opened.pop()
            try:
                close()
            except Exception as e:  # closing must go on for the rest
                log.warning("closing the %s failed: %s", what, e)

    def __enter__(self) -> Platform:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- L2: Redis ------------------------------------------------------------------------------
    @cached_property
    def provider(self) -> RedisProvider:
        from context_core.redis.connection import RedisProvider

        s = self.settings
        if self.fail_fast_redis:
            provider = RedisProvider(
                s,
                socket_timeout=s.service_redis_timeout_s,
                socket_connect_timeout=s.service_redis_connect_timeout_s,
            )
        else:
            provider = RedisProvider(s)
        self._track("redis provider", provider.close)
        return provider

    def _client(self, *, decode_responses: bool) -> RedisClient:
        if not self.fail_fast_redis:
            return self.provider.client(decode_responses=decode_responses)  # provider closes it
        provider = self.provider
        try:  # a cluster client already asks a node for the slot map here
            client = provider.new_client(
                decode_responses=decode_responses,
                socket_timeout=self.settings.service_redis_timeout_s,
                socket_connect_timeout=self.settings.service_redis_connect_timeout_s,
                fail_fast=True,
            )
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(
                f"Redis at {provider.safe_url} did not answer PING ({e}); fix CTX_REDIS_URL"
            ) from e
        what = "redis client" if decode_responses else "redis client (bytes)"
        self._track(what, client.close)
        if decode_responses:
            try:
                client.ping()
            except REDIS_ERRORS as e:
                raise BackendUnavailableError(
                    f"Redis at {provider.safe_url} did not answer PING ({e}); fix CTX_REDIS_URL"
                ) from e
        return client

    @cached_property
    def redis(self) -> redis.Redis:
        """The text client (``decode_responses=True``): L2, namespaces, owners.

        A :class:`redis.cluster.RedisCluster` when the server is a Redis Cluster (see
        :mod:`context_core.redis.connection`); it answers the same command methods. Typed as
        ``redis.Redis`` only for callers outside the library still annotated so
        (``evaluation/health.py``); the library's own parts take ``RedisClient``.
        """
        return cast(redis.Redis, self._client(decode_responses=True))

    @cached_property
    def redis_bin(self) -> RedisClient:
        """The bytes client: the query-embedding cache."""
        return self._client(decode_responses=False)

    @cached_property
    def gateway(self) -> Gateway:
        from context_core.gateway.sanitize import Gateway

        return Gateway.from_settings(self.settings)

    @cached_property
    def wm(self) -> WorkingMemory:
        from context_core.working_memory import WorkingMemory

        return WorkingMemory(
            self.redis, self.gateway, **WorkingMemory.settings_kwargs(self.settings)
        )

    @cached_property
    def namespaces(self) -> NamespaceRegistry:
        from context_core.access.namespaces import NamespaceRegistry

        return NamespaceRegistry(
            self.redis, self.gateway, audit_path=self.settings.data_dir / "audit" / "access.jsonl"
        )

    @cached_property
    def compliance(self) -> ComplianceStore:
        """Compliance profiles: PostgreSQL under row-level security when
        ``CTX_POSTGRES_URL`` is set, else Redis (the L2 client)."""
        from context_core.access.compliance import PostgresComplianceStore, RedisComplianceStore

        s = self.settings
        if s.postgres_url:
            store = PostgresComplianceStore(s.postgres_url, self.gateway, schema=s.postgres_schema)
            self._track("compliance store (postgres)", store.close)
            return store
        return RedisComplianceStore(self.redis, self.gateway)

    # --- L3: vector store, encoder, knowledge memory ------------------------------------------
    @cached_property
    def store(self) -> VectorStore:
        from context_core.knowledge import open_store

        try:
            store = open_store(self.settings)
        except OSError as e:
            raise BackendUnavailableError(
                f"could not open the vector store ({e}); check CTX_DATA_DIR "
                f"({self.settings.qdrant_dir}), CTX_QDRANT_URL and CTX_EDGE_SOCKET"
            ) from e
        self._track("vector store", store.close)
        if self.wrap_store is not None:
            store = self.wrap_store(store)
        return store

    @cached_property
    def encoder(self) -> Encoder:
        from context_core.knowledge.embedding import load_encoder, recorded_encoder

        s = self.settings
        # CTX_EMBED_BACKEND=auto follows the backend the existing collections were built with
        recorded = (
            recorded_encoder(self.store, s.collection_main, s.collection_hot)
            if s.embed_backend == "auto"
            else None
        )
        return load_encoder(
            s, redis_client=self.redis_bin if self.embed_cache else None, recorded=recorded
        )

    @cached_property
    def knowledge(self) -> KnowledgeMemory:
        from context_core.knowledge.memory import KnowledgeMemory

        km = KnowledgeMemory(self.store, self.encoder, self.settings, self.gateway)
        if self.ensure_collections:
            try:
                km.ensure_collections()
            except OSError as e:
                raise BackendUnavailableError(
                    f"could not create the collections {km.main!r}/{km.hot!r} ({e}); check "
                    f"that CTX_DATA_DIR ({self.settings.qdrant_dir}) is a writable directory"
                ) from e
        return km

    # --- routing and lifecycle -------------------------------------------------------------------
    @cached_property
    def registry(self) -> IntentRegistry:
        from context_core.routing.intents import IntentRegistry

        return IntentRegistry.builtin()

    @cached_property
    def tracer(self) -> TraceWriter:
        from context_core.traces import TraceWriter

        tracer = TraceWriter.from_settings(self.settings, self.gateway)
        self._track("trace writer", tracer.close)
        return tracer

    @cached_property
    def policy(self) -> PolicySource:
        """The thresholds in force, re-read when thresholds.json changes; refused when the
        file was calibrated for another model than the encoder's (the configured model's
        without knowledge)."""
        from context_core.routing.confidence import PolicySource

        return PolicySource(self.settings, model=self._encoder_name())

    def _encoder_name(self) -> str:
        """The name of the encoder this platform serves with (``Encoder.name``, what
        thresholds are calibrated for), without loading the model when there is no knowledge
        (:func:`~context_core.knowledge.embedding.serving_encoder_name`; the collections'
        record is read only when the store is open already: an L2-only platform opens none)."""
        if self.with_knowledge:
            return self.encoder.name
        from context_core.knowledge.embedding import serving_encoder_name

        store = self.__dict__.get("store")
        return serving_encoder_name(self.settings, store)

    @cached_property
    def prompts(self) -> PromptLibrary | None:
        """The prompt templates (shipped, plus ``CTX_PROMPT_TEMPLATES_DIR``), checked now:
        an invalid template raises :class:`~context_core.errors.PromptTemplateError` with its
        file and line. None with ``CTX_PROMPTS=false``."""
        from context_core.routing.prompts import PromptLibrary

        if not self.settings.prompts:
            return None
        return PromptLibrary.load(self.settings.prompt_templates_dir, intents=self.registry.specs)

    @cached_property
    def router(self) -> ContextRouter:
        from context_core.routing.router import ContextRouter

        s = self.settings
        router = ContextRouter(
            wm=self.wm,
            knowledge=self.knowledge if self.with_knowledge else None,
            policy=self.policy,
            max_fragments=s.bundle_max_fragments,
            tracer=self.tracer,
            namespaces=self.namespaces,
            registry=self.registry,
            l3_timeout_ms=s.l3_timeout_ms,
            l3_collection=s.collection_main,
            prompts=self.prompts,
        )
        self._track("router", router.close)
        return router

    @cached_property
    def lifecycle(self) -> LifecycleManager:
        from context_core.lifecycle.manager import LifecycleManager

        knowledge = self.knowledge if self.with_knowledge else None
        return LifecycleManager.from_settings(
            self.settings,
            wm=self.wm,
            gateway=self.gateway,
            knowledge=knowledge,
            namespaces=self.namespaces,
            compliance=self.compliance,
            # the L1 budget counted in the embedding model's tokens
            count_tokens=knowledge.encoder.count_tokens if knowledge is not None else None,
        )


def build_platform(
    settings: Settings,
    *,
    with_knowledge: bool = True,
    fail_fast_redis: bool = False,
    embed_cache: bool = True,
    ensure_collections: bool = True,
    wrap_store: Callable[[VectorStore], VectorStore] | None = None,
    eager: bool = False,
) -> Platform:
    """The one way to wire the library (see :class:`Platform` for the options).

    ``eager=False`` (default) opens nothing yet: parts open on first access, and the caller
    closes the platform (``with build_platform(s) as p: ...``). ``eager=True`` opens every
    part now (:meth:`Platform.open`), closing what was opened if one fails.
    """
    platform = Platform(
        settings,
        with_knowledge=with_knowledge,
        fail_fast_redis=fail_fast_redis,
        embed_cache=embed_cache,
        ensure_collections=ensure_collections,
        wrap_store=wrap_store,
    )
    return platform.open() if eager else platform


def run_hot_merge(settings: Settings, *, now: float | None = None) -> MergeSummary:
    """The daily job: open the store and encoder from settings, merge, close.

    With ``CTX_REDIS_URL`` set, the namespaces' ACLs are read from it so shared answers by
    agents still holding ``write`` can merge; without it (an embedded server would be empty)
    only system answers merge and shared ones wait.
    """
    from context_core.ingest.hot import merge_hot
    from context_core.knowledge.memory import AclSource

    # merges into the existing collections (none created); the model without a Redis cache
    with build_platform(settings, embed_cache=False, ensure_collections=False) as platform:
        if platform.store.info(settings.collection_hot) is None:
            from context_core.ingest.hot import MergeSummary as Summary

            return Summary(0, 0, 0, 0)
        namespaces: AclSource | None = platform.namespaces if settings.redis_url else None
        return merge_hot(platform.knowledge, now=now, namespaces=namespaces)
