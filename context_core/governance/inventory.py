"""The inventory: every store and file the platform writes, whose it is, how long it lives, and
how it is found and deleted.

This table is data, not prose: ``docs/data-lifecycle.md`` shows :func:`render_table`, and
``tests/test_inventory.py`` fails when a writer appears that no entry names: a Redis key family
in a string the code builds keys from, a module that writes files, a PostgreSQL table, an L3
collection or payload field. An entry's ``writers`` are the modules that write the store;
``families`` the Redis key families (the text before the first ``:``), ``tables`` the
PostgreSQL tables, ``fields`` the L3 payload fields.

``owner`` is what a record belongs to: ``org``, ``user`` (an org's user), ``session`` (and so the
session's user), ``agent`` (and so the agent's org), ``none`` (no personal data: the shared
corpus, synthetic load, configuration). ``erase`` is what ``ctx erase`` does with a user's
records there; ``retention`` what bounds their age.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["INVENTORY", "StoreEntry", "render_table"]


@dataclass(frozen=True)
class StoreEntry:
    name: str
    store: str  # redis | qdrant | postgres | file | airflow
    where: str
    holds: str
    owner: str
    lifetime: str
    find: str
    erase: str
    retention: str
    writers: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    collections: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()


#: ``ChunkPayload`` (ingest) fields: a page's chunk in main.
_CHUNK_FIELDS = (
    "source",
    "title",
    "section",
    "heading_path",
    "updated_at",
    "updated_at_ts",
    "chunk_index",
    "n_chunks",
    "n_tokens",
    "content_hash",
    "text",
    "model",
    "space",
    "scope",
    "source_file",
    "url",
    "page",
    "attachment",
)
#: What a hot answer or an upload's chunk adds (``upsert_hot``, the upload's records).
_HOT_FIELDS = (
    "expires_at",
    "confirmed",
    "written_by",
    "namespace",
    "trust",
    "claimed_source",
    "subject",
    "kind",
    "filename",
    "content_type",
)

INVENTORY: tuple[StoreEntry, ...] = (
    StoreEntry(
        "L2 session memory",
        "redis",
        "`wm:{<sid>}:*` (tool responses, step results, series, tasks, contract, bundle log, "
        "compliance snapshot, key index)",
        "what a session's tools returned and its task contract",
        "session",
        "minutes: TTLs from the step plan; the contract up to `CTX_WM_CONTRACT_TTL_S`; its "
        "history `CTX_WM_CONTRACT_HISTORY_TTL_S`",
        "the session's key index `wm:{<sid>}:index`; SCAN `wm:{<sid>}:*`",
        "deleted for every service session of the user",
        "own TTL (checked, never rewritten); the contract history bounded to "
        "`CTX_WM_CONTRACT_HISTORY_VERSIONS` versions and `CTX_WM_CONTRACT_HISTORY_DAYS` days at "
        "each write and by `ctx retention enforce`, dropped versions archived as digests",
        writers=(
            "context_core.working_memory.keys",
            "context_core.working_memory.store",
            "context_core.working_memory.memory",
        ),
        families=("wm",),
    ),
    StoreEntry(
        "activity index",
        "redis",
        "`ctx:activity` (Sorted Set: session id -> last activity)",
        "session ids and times, no content",
        "session",
        "until the idle sweep times the session out",
        "ZSCORE by session id",
        "the user's sessions removed",
        "idle sweep (`ctx sweep-idle`)",
        writers=("context_core.working_memory.lifetime",),
        families=("ctx",),
    ),
    StoreEntry(
        "service session records",
        "redis",
        "`svc:{<sid>}:session|state|lease`; `svc:agent:{<agent>}:*` quotas; "
        "`svc:state-signing-key`, `svc:state-seal-key`, `svc:idle-sweep:lock`",
        "owner agent, the latest signed L1 state (user id, query, trace), quotas",
        "session (quotas: agent)",
        "the session TTL (`CTX_SERVICE_SESSION_TTL_S`); quota windows a minute",
        "SCAN `svc:{*}:state`, the state's `user_id`, the owner's org",
        "deleted for every service session of the user",
        "own TTL (checked)",
        writers=(
            "context_app.service.owners",
            "context_app.service.deps",
            "context_app.service.idle",
        ),
        families=("svc",),
    ),
    StoreEntry(
        "user preferences",
        "redis",
        "`pref:{<org>:<uid>}:<type>` and `pref:{<org>:<uid>}:_index`",
        "a user's structured preferences (value, confidence, last_updated)",
        "user",
        "no TTL: until erased",
        "SCAN `pref:{<org>:*`, the key id's subject digest",
        "deleted",
        "the org's retention, by `last_updated` (`ctx retention enforce`)",
        writers=(
            "context_core.working_memory.preferences",
            "context_core.access.user_keys_migration",
        ),
        families=("pref",),
    ),
    StoreEntry(
        "compliance profiles (Redis)",
        "redis",
        "`cmp:{org:<org>}:profile|audit`, `cmp:{org:<org>}:user:<uid>`, "
        "`cmp:{org:<org>}:audit:user:<uid>`",
        "org and user profiles; audit entries (field names and digests, no values)",
        "org / user",
        "no TTL",
        "SCAN `cmp:{org:<org>}:user:*` and `...:audit:user:*`",
        "the user's profile and audit entries deleted",
        "erasure; audit entries beyond `CTX_COMPLIANCE_HISTORY_VERSIONS` (100) archived as "
        "digests by `ctx retention enforce`",
        writers=("context_core.access.compliance",),
        families=("cmp",),
    ),
    StoreEntry(
        "shared namespaces",
        "redis",
        "`ns:{<name>}:kv:<key>|meta|acl`, `ns:_acl-synced`",
        "context agents share within one org, and its ACL",
        "org (namespace), agent (writer)",
        "the namespace's TTL",
        "`ns:{<name>}:*`",
        "not touched: written by agents, not about a user",
        "own TTL",
        writers=("context_core.access.namespaces",),
        families=("ns",),
    ),
    StoreEntry(
        "query-embedding cache",
        "redis",
        "`embcache:<model>:<sha256 of query>`",
        "query vectors keyed by a hash of the query text",
        "none (no id; a vector, not text)",
        "24 h TTL",
        "by key only",
        "not touched (no owner recorded; expires within 24 h)",
        "own TTL",
        writers=("context_core.knowledge.embedding",),
        families=("embcache",),
    ),
    StoreEntry(
        "L3 knowledge: main",
        "qdrant",
        "collection `knowledge_main` (`CTX_COLLECTION_MAIN`)",
        "ingested pages' chunks; merged hot answers (`merged_from`, `subject`)",
        "none (the corpus); merged answers: the confirming user by `subject`",
        "until the page leaves its space; merged answers forever",
        "filter `subject` = the user's digest",
        "merged answers of the user deleted",
        "ingest's deletes by space; merged answers: the writing agent's org's retention",
        writers=(
            "context_core.ingest.pipeline",
            "context_core.ingest.hot",
            "context_core.knowledge.edge",
        ),
        collections=("main",),
        fields=(
            *_CHUNK_FIELDS,
            "merged_from",
            "merged_at",
            "trust",
            "written_by",
            "namespace",
            "subject",
        ),
    ),
    StoreEntry(
        "L3 knowledge: hot",
        "qdrant",
        "collection `hot_knowledge` (`CTX_COLLECTION_HOT`)",
        "confirmed answers (`subject`: the confirming user's digest), uploads' chunks",
        "agent (`written_by`), user (`subject`)",
        "72 h (`expires_at`), swept by the daily merge",
        "filter `subject`; uploads by `written_by`",
        "the user's answers deleted",
        "`expires_at` sweep; the writing agent's org's retention",
        writers=("context_core.knowledge.memory", "context_core.ingest.upload"),
        collections=("hot",),
        fields=(*_CHUNK_FIELDS, *_HOT_FIELDS),
    ),
    StoreEntry(
        "compliance tables",
        "postgres",
        "`<schema>.compliance_profiles`, `<schema>.compliance_audit` (row-level security per org)",
        "as the Redis profiles, when `CTX_POSTGRES_URL` is set",
        "org / user",
        "no limit",
        "rows `WHERE org_id AND user_id` (the user's key id)",
        "the user's rows deleted",
        "erasure; audit entries beyond `CTX_COMPLIANCE_HISTORY_VERSIONS` (100) archived as "
        "digests by `ctx retention enforce`",
        writers=("context_core.access.compliance",),
        tables=("compliance_profiles", "compliance_audit"),
    ),
    StoreEntry(
        "route traces",
        "file",
        "`<data_dir>/traces/traces-YYYY-MM-DD.jsonl`",
        "per route: session id, keys (user pairs hashed), cleaned query, citable tokens, "
        "step outputs",
        "session",
        "until deleted",
        "lines by `session_id`",
        "lines of the user's service sessions removed",
        "the org's retention, by `ts` and the agent's org (`ctx retention enforce`)",
        writers=("context_core.traces",),
    ),
    StoreEntry(
        "audit logs",
        "file",
        "`<data_dir>/audit/audit.jsonl` (gateway findings; erasure and retention receipts; "
        "archived history digests), `<data_dir>/audit/access.jsonl` (namespace decisions)",
        "field names, keyed hashes, agent ids; never values",
        "agent / org",
        "until the org's retention",
        "lines by `ts`, `org` or the agent's org",
        "kept: they hold digests, and the erasure's own receipt",
        "the org's retention by `ts` (`org`, or `agent_id`'s org; no org: the longest "
        "retention, once every org has one); erasure and retention receipts kept",
        writers=(
            "context_core.gateway.sanitize",
            "context_core.access.namespaces",
            "context_core.governance.erasure",
            "context_core.audit_trail",
        ),
    ),
    StoreEntry(
        "erasure ledger and subject key",
        "file",
        "`<data_dir>/erasure/ledger.jsonl`, `<data_dir>/keys/subject.key` (0600)",
        "erasures: org, subject digest, session digests; the HMAC key",
        "org",
        "as long as the oldest backup",
        "whole file",
        "appended to",
        "kept (replayed after every restore)",
        writers=("context_core.governance.ledger", "context_core.access.subjects"),
    ),
    StoreEntry(
        "upload quarantine",
        "file",
        "`<data_dir>/quarantine/uploads/<id>.bin`, `quarantine.jsonl`",
        "refused uploads, unredacted, and why",
        "agent (and so its org)",
        "until the org's retention, or an operator deletes them",
        "`quarantine.jsonl` lines (`at`, agent)",
        "not touched (uploads belong to the org)",
        "the uploading agent's org's retention by `at` (the `.bin`, then its line; no known "
        "agent: the longest retention)",
        writers=("context_core.ingest.upload",),
    ),
    StoreEntry(
        "ingest state and reports",
        "file",
        "`<data_dir>/confluence/<site>/<space>.json`, `<data_dir>/staging/*.json`, "
        "`<reports_dir>/ingest_summary.json|confluence_sync.json|quarantine.jsonl`, "
        "`<data_dir>/qdrant/*` (Edge shards, sidecars)",
        "sync cursors, refresh plans, run summaries; the embedded L3 files",
        "none (the corpus)",
        "replaced by the next run",
        "by path",
        "not touched (no personal data)",
        "replaced by the next run",
        writers=(
            "context_core.ingest.sync",
            "context_core.ingest.refresh_plan",
            "context_core.ingest.pipeline",
            "context_core.knowledge.edge",
            "context_core.knowledge.edge_server.process",
            "context_core.knowledge.edge_server.server",
            "context_core.fsutil",
        ),
    ),
    StoreEntry(
        "evaluation labels and reports",
        "file",
        "`<data_dir>/labels/labels.csv`, `<reports_dir>/*` (thresholds, calibrations, CER, "
        "health, retrieval, shadow)",
        "labelled queries (cleaned query text), metrics and plots",
        "none (aggregates; label queries are cleaned text without ids)",
        "replaced by the next run; calibration versions kept",
        "by path",
        "not touched; reports are rebuilt from the traces the erasure filtered",
        "replaced by the next run; no org retention: label rows (`query_id`, cleaned query, "
        "point id, similarity, label, annotator) and reports carry no org, session or user id "
        "to judge them by",
        writers=(
            "evaluation.beir",
            "evaluation.calibration",
            "evaluation.health_history",
            "evaluation.labels",
            "evaluation.plots",
            "evaluation.promotion",
            "evaluation.relevance_calibration",
            "evaluation.report",
            "evaluation.retrieval_report",
            "evaluation.shadow",
            "evaluation.workflows",
        ),
    ),
    StoreEntry(
        "embedded Redis files",
        "file",
        "`<data_dir>/valkey/` (RDB snapshot, config, password file)",
        "the embedded Valkey's copy of L2",
        "as L2",
        "as L2",
        "as L2",
        "as L2 (the server rewrites its snapshot)",
        "as L2",
        writers=("context_core.redis.connection",),
    ),
    StoreEntry(
        "Airflow home, XCom and logs",
        "airflow",
        "`<data_dir>/airflow/` (metadata DB with XCom, task logs), a deployment's `AIRFLOW_HOME`",
        "DAG run summaries (counts, paths); task logs through the log gateway",
        "none (job metadata)",
        "Airflow's own cleanup (`airflow db clean`)",
        "by DAG run",
        "not touched (no user data: tasks return counts)",
        "`airflow db clean --clean-before-timestamp`",
        writers=("context_app.airflow_local", "context_app.airflow_deploy"),
    ),
    StoreEntry(
        "API keys files",
        "file",
        "`api_keys.json` (sha256 digests), `loadtest.keys` (0600) where `--out` says",
        "agent credentials (digests; raw keys for load generators)",
        "agent",
        "until rotated",
        "by path",
        "not touched",
        "rotation",
        writers=("context_core.access.auth",),
    ),
    StoreEntry(
        "load-test and benchmark outputs",
        "file",
        "`<data_dir>/loadtest/`, `reports/loadtest/*`, `reports/benchmarks.md`, the L3 "
        "benchmark's build cache (`~/.cache/context-platform/bench`); Redis `bench:*` "
        "(deleted by the benchmark)",
        "synthetic sessions' results",
        "none (synthetic data)",
        "replaced by the next run",
        "by path",
        "not touched",
        "replaced by the next run",
        writers=(
            "loadtests.campaign",
            "loadtests.report",
            "loadtests.sampler",
            "benchmarks._common",
            "benchmarks.ingest_zip_bomb",
            "benchmarks.l3_search",
            "benchmarks.service_capacity",
        ),
        families=("bench",),
    ),
    StoreEntry(
        "generated documentation",
        "file",
        "`docs/prompts.md` (the shipped templates rendered with sample values)",
        "none (shipped templates, sample values)",
        "none",
        "replaced when regenerated",
        "by path",
        "not touched",
        "not touched",
        writers=("context_app.prompt_docs",),
    ),
)


def render_table() -> str:
    """The inventory as the Markdown table of ``docs/data-lifecycle.md``."""
    head = "| store | where | owner | lifetime | found by | on erasure | retention |"
    rows = [head, "|---|---|---|---|---|---|---|"]
    for e in INVENTORY:
        cells = (
            f"{e.name} ({e.store})",
            e.where,
            e.owner,
            e.lifetime,
            e.find,
            e.erase,
            e.retention,
        )
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
