"""The tunable defaults, declared once.

:class:`~context_core.config.Settings` declares its fields with these values, and the classes
that can also be built without settings (tests, scripts: ``Gateway()``, ``WorkingMemory(client,
gateway)``, ``ContextRouter(...)``, ``ConfidencePolicy()``, ``LifecycleManager(...)``) take
their keyword defaults from here, so a default changed here changes everywhere. This module
imports nothing, so any module may import it.
"""

from __future__ import annotations

import datetime as _dt
from typing import Literal

__all__ = [
    "ACCEPT_THRESHOLD",
    "BUNDLE_MAX_FRAGMENTS",
    "CLAMD_TIMEOUT_S",
    "COMPLIANCE_HISTORY_VERSIONS",
    "CORRECTION_MIN_CONFIDENCE",
    "HYBRID_DENSE_WEIGHT",
    "HYBRID_FEEDBACK",
    "HYBRID_FEEDBACK_WEIGHT",
    "HYBRID_FUSION",
    "L1_MAX_TRACE_TOKENS",
    "L3_TIMEOUT_MS",
    "MAX_RESPONSE_BYTES",
    "MAX_STEP_RESULT_BYTES",
    "POSTGRES_SCHEMA",
    "RETRIEVAL_MODE",
    "SESSION_IDLE_S",
    "SKIP_THRESHOLD",
    "UPLOAD_MAX_BYTES",
    "UPLOAD_TTL_HOURS",
    "WM_CONTRACT_HISTORY_DAYS",
    "WM_CONTRACT_HISTORY_TTL_S",
    "WM_CONTRACT_HISTORY_VERSIONS",
    "WM_CONTRACT_TTL_S",
    "WM_DEFAULT_TTL_S",
    "WM_MIN_TTL_S",
    "WM_SERIES_WINDOW",
]

# L1 / L2 (CTX_WM_*, CTX_SESSION_IDLE_S, CTX_MAX_STEP_RESULT_BYTES, CTX_L1_MAX_TRACE_TOKENS)
WM_DEFAULT_TTL_S = 900
WM_SERIES_WINDOW = 1000
WM_MIN_TTL_S = 60
WM_CONTRACT_TTL_S = 7200
WM_CONTRACT_HISTORY_TTL_S = 30 * 86_400
WM_CONTRACT_HISTORY_VERSIONS = 50  # bounded history: older versions archived as digests
WM_CONTRACT_HISTORY_DAYS = 7
SESSION_IDLE_S = 90
MAX_STEP_RESULT_BYTES = 16 * 1024
L1_MAX_TRACE_TOKENS = 2000
CORRECTION_MIN_CONFIDENCE = 0.6

# routing (CTX_L3_TIMEOUT_MS, CTX_BUNDLE_MAX_FRAGMENTS, CTX_ACCEPT/SKIP_THRESHOLD)
L3_TIMEOUT_MS = 100.0
# How long the router trusts its last look at thresholds.json, relevance_model.json and the
# shadow marker (CTX_POLICY_RECHECK_S): each is stat-ed at most once per this many seconds, so
# a promote, rollback or shadow start/stop is in force at most this long after it is written.
POLICY_RECHECK_S = 1.0
BUNDLE_MAX_FRAGMENTS = 3
ACCEPT_THRESHOLD = 0.72
SKIP_THRESHOLD = 0.65

# L3 retrieval (CTX_RETRIEVAL_MODE, CTX_HYBRID_FUSION): dense, sparse (BM25) or both fused;
# a collection without sparse vectors answers as dense. HYBRID_DENSE_WEIGHT is the weighted
# fusion's share of the dense cosine (the rest is BM25 over the best BM25 of the candidates).
# Chosen by measurement (minilm, recall@10 over dense / sparse / rrf / weighted 0.3-0.8):
# Cranfield 0.416 / 0.391 / 0.444 / 0.452 at 0.7; CMRC 2018 (test-500) 0.332 / 0.998 / 0.720 /
# 1.000 at 0.7. RRF gives a weak list the same say as a strong one (the English model on
# Chinese text), the weighted sum keeps its low cosines low.
RETRIEVAL_MODE: Literal["dense", "sparse", "hybrid"] = "hybrid"
HYBRID_FUSION: Literal["rrf", "weighted"] = "weighted"
HYBRID_DENSE_WEIGHT = 0.7
# Pseudo-relevance feedback (CTX_HYBRID_FEEDBACK): hybrid retrieval runs its dense leg a second
# time with the query vector moved towards the mean of its first pass's best N chunks
# (Rocchio: q' = q + HYBRID_FEEDBACK_WEIGHT * mean(top N), normalised), then fuses again.
# Hit.score stays the cosine to the query itself. 0 turns it off. Measured with `ctx eval
# compare-retrieval` (minilm, Snowball BM25), hybrid recall@10 without / with N=3: Cranfield
# 0.457 / 0.488, CMRC 2018 0.945 / 0.991 (nDCG@10 0.418 / 0.436 and 0.846 / 0.946). In a
# brute-force sweep N=3-5 with weight 1-2 all gave Cranfield 1.15-1.17x dense; N=10 fed back
# too much noise (1.11-1.12x). Cost: one more engine batch per main-collection search.
HYBRID_FEEDBACK = 3
HYBRID_FEEDBACK_WEIGHT = 1.0

# Qdrant server collections (CTX_QDRANT_SHARDS, CTX_QDRANT_REPLICATION,
# CTX_QDRANT_WRITE_CONSISTENCY): Qdrant's own defaults. A cluster spreads a collection over
# SHARDS shards, each held by REPLICATION peers; a write is acknowledged once
# WRITE_CONSISTENCY replicas applied it. Qdrant Edge ignores them (one local shard).
QDRANT_SHARDS = 1
QDRANT_REPLICATION = 1
QDRANT_WRITE_CONSISTENCY = 1

# uploads (CTX_CLAMD_TIMEOUT_S, CTX_UPLOAD_MAX_BYTES, CTX_UPLOAD_TTL_HOURS): a 20 MiB file
# stays below clamd's default StreamMaxLength (25 MiB); uploads live as long as hot answers.
CLAMD_TIMEOUT_S = 30.0
UPLOAD_MAX_BYTES = 20 * 1024 * 1024
UPLOAD_TTL_HOURS = 72.0

# gateway (CTX_MAX_RESPONSE_BYTES)
MAX_RESPONSE_BYTES = 10 * 1024
# compliance audit entries kept per profile (CTX_COMPLIANCE_HISTORY_VERSIONS)
COMPLIANCE_HISTORY_VERSIONS = 100

# compliance profiles in PostgreSQL (CTX_POSTGRES_SCHEMA)
POSTGRES_SCHEMA = "ctx_compliance"


#: End of the migration window for signed (unencrypted) L1 states (CTX_STATE_LEGACY_UNTIL):
#: eight weeks after sealed states shipped.
STATE_LEGACY_UNTIL = _dt.datetime(2027, 1, 31, tzinfo=_dt.UTC)
