"""Settings, read from ``CTX_*`` environment variables (and an optional ``.env`` file).

Nothing is read at import time: call :func:`get_settings` and pass the result down.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from context_core import defaults as D
from context_core.errors import ConfigError

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """Every knob of the platform. Each field maps to ``CTX_<FIELD NAME>``."""

    model_config = SettingsConfigDict(env_prefix="CTX_", env_file=None, extra="ignore", frozen=True)

    # --- storage locations -------------------------------------------------------------
    data_dir: Path = Field(Path("./.ctx"), description="Embedded stores, traces, caches.")
    reports_dir: Path = Field(Path("./reports"), description="Where jobs write reports.")

    # --- L2 working memory (Redis / Valkey) -------------------------------------------
    redis_url: str | None = Field(
        None,
        description="redis://host:port/db of a Redis 7+/Valkey server; unset = embedded. A "
        "Redis Cluster: redis+cluster://host:port (rediss+cluster:// with TLS), or a plain "
        "redis:// URL of any cluster node (detected with INFO cluster); DB 0 only.",
    )
    redis_min_replicas: int = Field(
        0,
        ge=0,
        le=16,
        description="Opt-in durability of L2 and session writes: after each write, WAIT for "
        "this many replicas to acknowledge it (at most CTX_REDIS_REPLICA_WAIT_MS) and fail "
        "the write (503) when fewer did. 0 = off (Redis replication is asynchronous: a write "
        "acknowledged by a master that dies before replicating it is lost on failover). The "
        "write itself is not undone on failure: it may still be applied; retry it.",
    )
    redis_replica_wait_ms: int = Field(
        100,
        ge=1,
        le=60_000,
        description="How long a write waits for CTX_REDIS_MIN_REPLICAS acknowledgements; "
        "below the clients' socket timeout (the service's: CTX_SERVICE_REDIS_TIMEOUT_S).",
    )
    wm_default_ttl_s: int = Field(D.WM_DEFAULT_TTL_S, gt=0, description="Default L2 TTL (15 min).")
    wm_series_window: int = Field(
        D.WM_SERIES_WINDOW, gt=0, description="Points kept per sensor series."
    )
    wm_min_ttl_s: int = Field(
        D.WM_MIN_TTL_S,
        gt=0,
        description="Floor of a plan-derived step TTL: an output whose dependent is already "
        "due or overdue still lives this long, so a late agent finds its input.",
    )
    wm_contract_ttl_s: int = Field(
        D.WM_CONTRACT_TTL_S,
        gt=0,
        description="Lifetime of a session's task contract, refreshed by every session "
        "activity (event or route): the contract lives for the task, not for the 15-minute "
        "L2 default. The reference design's working range is 300-7200 s (5 min - 2 h).",
    )
    wm_contract_history_ttl_s: int = Field(
        D.WM_CONTRACT_HISTORY_TTL_S,
        gt=0,
        description="Retention of the contract's version history (audit): every accepted "
        "version, and the archived one of a completed task, kept this long after its last "
        "write. At least CTX_WM_CONTRACT_TTL_S.",
    )
    wm_contract_history_versions: int = Field(
        D.WM_CONTRACT_HISTORY_VERSIONS,
        ge=1,
        description="Versions a task contract's history keeps: each write trims the older "
        "ones (in the same Lua script) and archives them into the audit log as digests "
        "(version, time, SHA-256, changed field names; never values).",
    )
    wm_contract_history_days: float = Field(
        D.WM_CONTRACT_HISTORY_DAYS,
        gt=0,
        description="Age (days) past which a contract history version is trimmed and archived "
        "as a digest, at the next write or by `ctx retention enforce`; the newest version "
        "always stays.",
    )
    session_idle_s: int = Field(
        D.SESSION_IDLE_S,
        gt=0,
        description="A session with no activity (event or route) for this long is timed out "
        "by the idle sweep: session_timeout semantics (trace cleared, contract marked "
        "expired and kept, other L2 keys deleted).",
    )
    idle_sweep_interval_s: float = Field(
        15.0,
        ge=0,
        description="How often the service runs the idle sweep (0 = never; `ctx session "
        "sweep-idle` runs it once).",
    )
    l1_max_trace_tokens: int = Field(
        D.L1_MAX_TRACE_TOKENS,
        gt=0,
        description="context_overflow trigger: when the L1 trace holds more tokens than this "
        "(counted with the embedding model's tokenizer), the oldest pairs are evicted and "
        "low-priority L2 TTLs shortened.",
    )
    correction_min_confidence: float = Field(
        D.CORRECTION_MIN_CONFIDENCE,
        ge=0.0,
        le=1.0,
        description="user_message: a message is treated as a correction of the task contract "
        "(negation + a value that contradicts the contract) above this confidence.",
    )

    # --- compliance profiles (context_core.access.compliance) ---------------------------------
    postgres_url: str | None = Field(
        None,
        description="postgresql://role@host:port/db: compliance profiles in PostgreSQL with "
        "row-level security per organisation; unset = in Redis with L2. The serving role: it "
        "must not be a superuser or BYPASSRLS (refused: they ignore row-level security), and "
        "the schema must be migrated first (`ctx db upgrade`).",
    )
    postgres_schema: str = Field(
        D.POSTGRES_SCHEMA,
        pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="Schema of the platform's PostgreSQL tables, created and changed only by "
        "the migrations (`ctx db upgrade`); the service refuses to start when it is behind.",
    )
    postgres_owner_url: SecretStr | None = Field(
        None,
        description="postgresql://owner@host:port/db: the role that owns the schema and runs "
        "the migrations (`ctx db upgrade`); never the serving role. Not used while serving.",
    )
    postgres_app_role: str | None = Field(
        None,
        pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="The serving role the migrations grant USAGE on the schema and "
        "SELECT/INSERT/UPDATE/DELETE on its tables (never CREATE); unset = the user of "
        "CTX_POSTGRES_URL.",
    )

    # --- L3 knowledge memory (Qdrant) ---------------------------------------------------
    qdrant_url: str | None = Field(
        None, description="URL of a Qdrant server/cluster; unset = embedded Qdrant Edge."
    )
    qdrant_api_key: SecretStr | None = Field(
        None, description="API key sent to the Qdrant server (CTX_QDRANT_URL); never logged."
    )
    qdrant_search_threads: int = Field(
        1,
        ge=0,
        description="Search threads of each embedded Qdrant Edge shard (0 = one per CPU). One "
        "is fastest for the small top-k queries of routing: the engine holds the GIL while it "
        "waits for its pool, so a pool only adds hand-offs (measured in reports/benchmarks.md).",
    )
    qdrant_hnsw_ef: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="HNSW search beam width of the embedded Qdrant Edge (unset = the engine's "
        "default). Raise it for large collections: at 1,000,000 points a filtered top-3 reaches "
        "recall@3 0.99 against exact search at 384 with CTX_QDRANT_OVERSAMPLING=4 "
        "(reports/benchmarks.md, L3 at 1,000,000). Cost per search grows with it; capped at "
        "4,096.",
    )
    qdrant_oversampling: float | None = Field(
        None,
        ge=1.0,
        le=16.0,
        description="int8 candidates per wanted hit that the embedded Qdrant Edge rescores "
        "with the original float vectors (unset = 2). On near-tied neighbours the int8 order "
        "is coarse: a larger value recovers recall for a few more vector reads per search "
        "(reports/benchmarks.md, L3 at 1,000,000).",
    )
    edge_socket: Path | None = Field(
        None,
        description="Unix socket of a `context_core.knowledge.edge_server` that owns the "
        "embedded Qdrant Edge shards; set for several worker processes.",
    )
    qdrant_shards: int = Field(
        D.QDRANT_SHARDS,
        ge=1,
        description="shard_number of the collections the server backend creates (a Qdrant "
        "cluster spreads them over its peers); embedded Qdrant Edge ignores it.",
    )
    qdrant_replication: int = Field(
        D.QDRANT_REPLICATION,
        ge=1,
        description="replication_factor of the collections the server backend creates (copies "
        "of each shard on different peers); embedded Qdrant Edge ignores it.",
    )
    qdrant_write_consistency: int = Field(
        D.QDRANT_WRITE_CONSISTENCY,
        ge=1,
        description="write_consistency_factor of the collections the server backend creates "
        "(replicas that must apply a write before it is acknowledged; at most "
        "CTX_QDRANT_REPLICATION); embedded Qdrant Edge ignores it.",
    )

    @model_validator(mode="after")
    def _qdrant_write_quorum(self) -> Settings:
        if self.qdrant_write_consistency > self.qdrant_replication:
            raise ValueError(
                f"CTX_QDRANT_WRITE_CONSISTENCY={self.qdrant_write_consistency} exceeds "
                f"CTX_QDRANT_REPLICATION={self.qdrant_replication}: a write cannot wait for "
                "more replicas than a shard has"
            )
        return self

    collection_main: str = Field(
        "knowledge_main", description="L3 collection the weekly refresh writes (curated knowledge)."
    )
    collection_hot: str = Field(
        "hot_knowledge",
        description="L3 collection of answers confirmed during sessions, merged daily into main.",
    )
    hot_ttl_hours: float = Field(
        72.0,
        gt=0,
        description="Hours a confirmed answer stays in the hot collection unless merged.",
    )
    l3_top_k: int = Field(
        3, gt=0, le=100, description="Knowledge hits one L3 search returns (before thresholds)."
    )
    l3_timeout_ms: float = Field(
        D.L3_TIMEOUT_MS,
        gt=0,
        description="A route waits this long for L3; later, the bundle is served without it "
        "(degraded, with the reason).",
    )
    retrieval_mode: Literal["dense", "sparse", "hybrid"] = Field(
        D.RETRIEVAL_MODE,
        description="L3 retrieval: dense cosine, sparse BM25, or both fused; a collection "
        "without sparse vectors answers as dense (`ctx add-sparse` adds them).",
    )
    hybrid_fusion: Literal["rrf", "weighted"] = Field(
        D.HYBRID_FUSION,
        description="How hybrid retrieval fuses the dense and sparse lists: reciprocal rank "
        "fusion, or a weighted sum of cosine and max-normalised BM25.",
    )
    hybrid_feedback: int = Field(
        D.HYBRID_FEEDBACK,
        ge=0,
        le=20,
        description="Pseudo-relevance feedback in hybrid retrieval: the dense leg runs again "
        "with the query moved towards its first pass's best N chunks; 0 turns it off.",
    )

    # --- embeddings ---------------------------------------------------------------------
    embed_model: str = Field("minilm", description="Registry name (minilm, bge-m3) or a path.")
    embed_batch_size: int = Field(64, gt=0, description="Texts per encoder batch when embedding.")
    embed_cache_ttl_s: int = Field(
        86_400, gt=0, description="Seconds a query embedding stays in the Redis embedding cache."
    )
    embed_device: str = Field(
        "cpu", description="Torch device for the encoder (cpu, cuda, cuda:1)."
    )
    embed_backend: Literal["auto", "torch", "onnx-int8"] = Field(
        "auto",
        description="How the encoder runs: torch (fp32, the weights as shipped), onnx-int8 "
        "(ONNX Runtime, the same weights with dynamic int8 quantisation, exported once and "
        "cached in encoder_cache_dir) or auto: a collection is queried and written with the "
        "backend that built it (a torch-built collection keeps working), a new one is built "
        "with onnx-int8, or with torch and a WARNING saying why when the int8 export cannot "
        "run. A collection records the backend that built it; an explicit torch or onnx-int8 "
        "that differs from it is refused with a message.",
    )
    encoder_cache_dir: Path | None = Field(
        None,
        description="Where exported ONNX encoders are kept (None: $XDG_CACHE_HOME or "
        "~/.cache, under context-platform/encoders). Shared by every data dir of the user.",
    )

    # --- ingestion ----------------------------------------------------------------------
    chunk_max_tokens: int = Field(
        256, gt=8, description="Largest chunk, in encoder tokens (heading-aware chunking)."
    )
    chunk_overlap_tokens: int = Field(
        32, ge=0, description="Tokens a chunk repeats from the one before (below chunk_max_tokens)."
    )
    max_page_bytes: int = Field(
        5 * 1024 * 1024,
        gt=0,
        description="Largest page file (or zip member, uncompressed) read; bigger ones are "
        "quarantined unread.",
    )
    max_export_bytes: int = Field(
        2 * 1024**3,
        gt=0,
        description="Total uncompressed bytes read from one export; page files past it are "
        "quarantined (zip-bomb guard).",
    )
    max_markup_depth: int = Field(
        200,
        gt=8,
        description="Deepest element nesting a page may have; deeper pages are quarantined.",
    )
    ingest_max_delete_share: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="A refresh that would delete more than this share of a space's pages "
        "stops before writing unless --allow-deletes is given.",
    )

    # --- Confluence REST sync (ctx ingest --confluence-url; context_core.ingest.sync) ------
    confluence_user: str | None = Field(
        None,
        description="Confluence Cloud account e-mail for the REST sync; with "
        "CTX_CONFLUENCE_TOKEN it makes HTTP Basic auth. Unset = the token is a Data Center "
        "personal access token, sent as Bearer.",
    )
    confluence_token: SecretStr | None = Field(
        None,
        description="Confluence API token (Cloud, with CTX_CONFLUENCE_USER) or personal access "
        "token (Data Center). Read from the environment only; never logged or reported.",
    )
    confluence_timeout_s: float = Field(
        30.0, gt=0, le=600, description="Timeout of one Confluence HTTP request (connect+read)."
    )
    confluence_max_requests: int = Field(
        5000,
        gt=0,
        description="Most HTTP requests one sync run may send (retries included); past it the "
        "run stops before writing anything. Raise it for very large spaces.",
    )
    confluence_max_retries: int = Field(
        5,
        ge=0,
        le=20,
        description="Retries of one Confluence request after 429/503 (Retry-After honoured), "
        "other 5xx or a connection error, with exponential backoff and jitter.",
    )
    confluence_backoff_s: float = Field(
        1.0,
        ge=0,
        description="First backoff of a retried Confluence request; doubles per retry, "
        "randomised (full jitter), capped by CTX_CONFLUENCE_MAX_WAIT_S.",
    )
    confluence_max_wait_s: float = Field(
        60.0,
        ge=0,
        description="Longest single wait between Confluence retries, Retry-After included "
        "(a larger Retry-After is capped to this).",
    )
    confluence_attachments: bool = Field(
        True,
        description="Also ingest the PDF/text/HTML/Markdown attachments of synced pages "
        "through the upload checks (ClamAV scan, size, type, blocked keywords, redaction).",
    )

    # --- uploads (POST /v1/uploads; context_core.ingest.upload) -------------------------
    clamd_url: str | None = Field(
        None,
        description="clamd's socket for the upload malware scan: unix:///path/clamd.sock or "
        "tcp://host:3310. Unset (or unreachable) = every upload is refused with 503: files "
        "are never stored unscanned.",
    )
    clamd_timeout_s: float = Field(
        D.CLAMD_TIMEOUT_S,
        gt=0,
        le=600,
        description="Longest one clamd command (connect, stream, verdict) may take; past it "
        "the upload is refused with 503 + Retry-After.",
    )
    upload_max_bytes: int = Field(
        D.UPLOAD_MAX_BYTES,
        gt=0,
        description="Largest uploaded file (413 beyond); keep it below clamd's StreamMaxLength.",
    )
    upload_ttl_hours: float = Field(
        D.UPLOAD_TTL_HOURS,
        gt=0,
        description="Uploaded files are indexed in the hot collection, in the uploader's "
        "scope, unreviewed; their chunks expire after this long (re-upload to keep them).",
    )
    blocked_keywords: str = Field(
        "",
        description="Comma-separated keywords an upload must not contain (matched "
        "case-insensitively on word boundaries, as substrings in CJK text); a file with one "
        "is quarantined (422). Empty = none.",
    )

    # --- confidence thresholds ---------------------------------------------------------
    accept_threshold: float = Field(
        D.ACCEPT_THRESHOLD,
        ge=-1.0,
        le=1.0,
        description="Cosine at or above which a hit is confident; used when no calibrated "
        "thresholds.json is in force.",
    )
    skip_threshold: float = Field(
        D.SKIP_THRESHOLD,
        ge=-1.0,
        le=1.0,
        description="Cosine below which a hit is left out; used when no calibrated "
        "thresholds.json is in force.",
    )
    thresholds_path: Path | None = Field(
        None, description="thresholds.json from calibration; default <reports_dir>/thresholds.json"
    )
    calibration_min_per_class: int = Field(
        30,
        ge=1,
        description="Promotion gate labels_per_class: a calibration is promoted only when its "
        "labels hold at least this many relevant and this many irrelevant hits.",
    )
    calibration_not_worse_margin: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Promotion gate not_worse: the candidate is refused when the lower bound "
        "of the paired-bootstrap 95% CI of its balanced-accuracy difference to the calibration "
        "in force (same labels) is below minus this margin.",
    )
    confidence_rule: Literal["design", "per_hit"] = Field(
        "design",
        description="design: L3 is left out only when every hit is below skip, otherwise "
        "hits below accept are low_confidence; per_hit: each hit below skip is dropped.",
    )
    policy_recheck_s: float = Field(
        D.POLICY_RECHECK_S,
        ge=0.0,
        description="Seconds the router trusts its last look at thresholds.json, "
        "relevance_model.json and calibrations/shadow.json before it stats them again: a "
        "promote, rollback or shadow change is in force within this bound (0: stat all three "
        "on every route).",
    )
    thresholds_model_mismatch: Literal["refuse", "warn"] = Field(
        "refuse",
        description="thresholds.json calibrated for another embedding model than the one "
        "in use: refuse (log an error, use the CTX_ACCEPT/SKIP_THRESHOLD defaults) or warn "
        "(log a warning, use them anyway).",
    )
    state_keys: SecretStr | None = Field(
        None,
        description="AES-256 keys sealing the L1 state on the wire: '<kid>:<base64url 32 "
        "bytes>,<kid>:...'; the first seals, every listed key opens (rotation: prepend the "
        "new key, drop an old one once no session can still hold it). Generate an entry with "
        "python -m context_core.session.seal <kid>. From the environment or a secrets "
        "manager, never committed (docs/security.md).",
    )
    state_legacy_until: dt.datetime = Field(
        D.STATE_LEGACY_UNTIL,
        description="End of the migration window: until then a state in the old signed "
        "(unencrypted) form is still accepted; after it, refused (403 state_refused).",
    )
    prompt_templates_dir: Path | None = Field(
        None,
        description="A directory of operator prompt templates, <intent>.j2 (Jinja2, "
        "sandboxed): each adds a template or replaces the shipped one of that intent. Every "
        "template is checked at start-up; an invalid one stops the service with its file "
        "and line (docs/prompts.md).",
    )
    prompts: bool = Field(
        True,
        description="Render each bundle into its intent's prompt template (the bundle's "
        "prompt field); false leaves prompt null.",
    )
    bundle_max_fragments: int = Field(
        D.BUNDLE_MAX_FRAGMENTS,
        gt=0,
        le=100,
        description="A bundle holds at most this many fragments (the most relevant across "
        "layers); the rest are listed by reference in context_used.by_reference. An intent "
        "may set its own max_fragments.",
    )

    # --- gateway ------------------------------------------------------------------------
    max_response_bytes: int = Field(
        D.MAX_RESPONSE_BYTES,
        gt=0,
        description="A tool response larger than this (cleaned, as JSON) is not stored; "
        "it is replaced by an error and audited.",
    )
    audit_hmac_key: SecretStr | None = Field(
        None, description="Key for HMAC-SHA256 audit hashes; unset = plain SHA-256."
    )
    compliance_history_versions: int = Field(
        D.COMPLIANCE_HISTORY_VERSIONS,
        ge=1,
        description="Audit entries kept per compliance profile (org or user); older ones are "
        "moved to the audit log in digest form by `ctx retention enforce`.",
    )

    # --- service ------------------------------------------------------------------------
    service_host: str = Field("127.0.0.1", description="Address `ctx serve` binds.")
    service_port: int = Field(8080, gt=0, lt=65536, description="Port `ctx serve` listens on.")
    grpc_port: int = Field(
        0,
        ge=0,
        lt=65536,
        description="Port of the gRPC context service (`ctx serve --grpc-port`, "
        "docs/grpc.md), on `CTX_SERVICE_HOST`; 0: no gRPC.",
    )
    grpc_max_concurrent_rpcs: int = Field(
        256,
        gt=0,
        description="gRPC calls one process runs at once; beyond, RESOURCE_EXHAUSTED at once "
        "(the HTTP shedding threshold CTX_SHED_INFLIGHT counts them too).",
    )
    api_keys_file: Path | None = Field(
        None, description="JSON {agent_id: {key_sha256, namespaces, purposes}}"
    )
    max_body_bytes: int = Field(
        256 * 1024, gt=0, description="Largest request body the service reads; 413 beyond."
    )
    service_execution: Literal["loop", "threads"] = Field(
        "loop",
        description="Where the service runs its hot endpoints: 'loop' = on the event loop, "
        "each Redis round trip awaited with an asynchronous twin of the client (no thread "
        "hop, no GIL handover per request; the loop keeps answering while a request waits); "
        "'threads' = one worker thread per request (anyio's pool). A Redis Cluster always "
        "runs on threads.",
    )
    service_threads: int = Field(
        40,
        ge=1,
        le=1000,
        description="Worker threads per service process for the endpoints that run on threads "
        "(all of them with CTX_SERVICE_EXECUTION=threads; anyio's default limiter). Fewer "
        "threads interleave fewer requests under the GIL.",
    )
    gc_gen0_threshold: int = Field(
        20_000,
        ge=100,
        le=1_000_000,
        description="The service process's garbage-collector threshold for the youngest "
        "generation (gc.set_threshold(n, 10, 10), set after the startup freeze). Python's "
        "default, 700, is below what a worker's requests in flight hold alive, so the "
        "collector kept walking and promoting that live working set: 20-40 collections a "
        "second and 0.5-3.5 % of a worker's CPU in a short_sessions campaign at 1,000 req/s "
        "(README, 'The garbage collector'). 20,000: a collection every few thousand "
        "requests, ~10 ms each.",
    )
    shed_inflight: int = Field(
        96,
        ge=0,
        description="Load shedding: a worker process already holding this many requests answers "
        "new ones 503 with Retry-After (ops endpoints excepted) instead of queueing them into "
        "multi-second latencies. 0 = never shed.",
    )
    degrade_inflight: int = Field(
        48,
        ge=0,
        description="Degradation before shedding: from this many requests in flight in a worker, "
        "context loads skip L3 (bundle degraded=true, reason 'load') so the L1/L2 part stays "
        "fast. 0 = never. Must be below CTX_SHED_INFLIGHT when both are set.",
    )
    shed_retry_after_s: int = Field(
        1, ge=1, le=60, description="Retry-After seconds of a shed (503) answer."
    )
    fault_slow_l3_ms: float = Field(
        0.0, ge=0, description="Fault drill: every L3 store call sleeps this long (0 = off)."
    )
    service_redis_timeout_s: float = Field(
        0.15,
        gt=0,
        le=30,
        description="Socket read timeout of every Redis client on the service's request path "
        "(L2, owners, namespaces, embedding cache): a hung Redis is a 503 after this long.",
    )
    service_redis_connect_timeout_s: float = Field(
        0.15, gt=0, le=30, description="Connect timeout of the service's Redis clients."
    )
    acl_check_interval_s: float = Field(
        5.0,
        ge=0,
        description="At most this often the service checks (one EXISTS) that Redis still holds "
        "the namespace ACLs synced from CTX_API_KEYS_FILE, and re-syncs them after a Redis "
        "restart or flush.",
    )
    trace_hash_keys: bool = Field(
        True,
        description="Trace writers built from settings (the service, ctx demo) record a stable "
        "hash instead of the client-supplied segments of L2/NS key names.",
    )
    l1_max_result_bytes: int = Field(
        2048,
        gt=0,
        description="A tool call's args or result whose cleaned JSON is bigger than this goes "
        "to L2 (wm:{<sid>}:result:<call id>); the L1 trace keeps status + sha256 + the L2 key.",
    )
    l1_max_state_bytes: int = Field(
        64 * 1024,
        gt=1024,
        description="Largest sealed L1 state (characters of the ctx1.<kid>.<data> string) the "
        "service hands out or accepts: an event that would make a bigger one is refused with "
        "413 and the state sent stays valid; a bigger one sent in a request is refused (403 "
        "state_refused) before it is decoded.",
    )
    max_step_result_bytes: int = Field(
        D.MAX_STEP_RESULT_BYTES,
        gt=0,
        description="Largest L2 step result (cleaned JSON of its fields); bigger ones are "
        "refused (413), or stored as a pointer to the tool call's L2 copy.",
    )
    output_sanitize_budget_ms: float = Field(
        1000.0,
        gt=0,
        le=60_000,
        description="CPU time (ms) the service may spend cleaning one agent output "
        "(POST .../outputs: Markdown links, HTML, secrets/PII; run off the event loop); "
        "over it the request is answered 413 output_sanitize_budget_exceeded and nothing is "
        "stored. The sanitizer is linear: a 256 KB output takes well under 100 ms.",
    )
    max_live_sessions_per_agent: int = Field(
        1000, gt=0, description="Open service sessions one agent may hold (429 beyond)."
    )
    max_write_bytes_per_agent_per_min: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Request-body bytes one agent may send to the writing endpoints per "
        "minute (sessions, events, outputs); 429 with Retry-After beyond.",
    )

    log_level: str = Field(
        "INFO", description="Python logging level (DEBUG, INFO, WARNING, ERROR)."
    )

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Settings:
        if self.skip_threshold > self.accept_threshold:
            raise ValueError(
                f"CTX_SKIP_THRESHOLD ({self.skip_threshold}) must not exceed "
                f"CTX_ACCEPT_THRESHOLD ({self.accept_threshold})"
            )
        if self.wm_contract_history_ttl_s < self.wm_contract_ttl_s:
            raise ValueError(
                f"CTX_WM_CONTRACT_HISTORY_TTL_S ({self.wm_contract_history_ttl_s}) must be at "
                f"least CTX_WM_CONTRACT_TTL_S ({self.wm_contract_ttl_s}): the audit history "
                "outlives the contract it records"
            )
        if self.chunk_overlap_tokens >= self.chunk_max_tokens:
            raise ValueError("CTX_CHUNK_OVERLAP_TOKENS must be smaller than CTX_CHUNK_MAX_TOKENS")
        if self.shed_inflight and self.degrade_inflight >= self.shed_inflight:
            raise ValueError(
                f"CTX_DEGRADE_INFLIGHT ({self.degrade_inflight}) must be below CTX_SHED_INFLIGHT "
                f"({self.shed_inflight}): bundles degrade (L3 skipped) before requests are shed"
            )
        return self

    # Derived locations: computed, never stored twice.
    @property
    def traces_dir(self) -> Path:
        return self.data_dir / "traces"

    @property
    def qdrant_dir(self) -> Path:
        return self.data_dir / "qdrant"

    @property
    def upload_quarantine_dir(self) -> Path:
        """Refused uploads (``<id>.bin``) and their ``quarantine.jsonl``."""
        return self.data_dir / "quarantine" / "uploads"

    @property
    def resolved_thresholds_path(self) -> Path:
        return self.thresholds_path or (self.reports_dir / "thresholds.json")


def get_settings(**overrides: Any) -> Settings:
    """Build settings from the environment, with explicit overrides on top.

    A validation error is re-raised as :class:`ConfigError` naming the ``CTX_`` variable.
    """
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            lines.append(f"CTX_{field.upper()}: {err['msg']}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from e
