"""The hot path: answers confirmed during sessions, kept 72 h, merged into main once a day.

Why a separate collection: an answer an agent gave when L3 had nothing (a *fallback*) may be
right, but nobody has curated it. It lands in ``hot_knowledge`` with an expiry, is searchable at
once, and only a confirmed one graduates into ``knowledge_main``, by the daily merge, unless
main already holds a near-duplicate. Expired hot points are dropped by the same merge.

What is stored is a de-personalised Q/A pair: the gateway strips PII and secrets, terms are
normalised (NFKC folds full-width forms to half-width, whitespace collapses) and the pair's key
is the lower-cased normalised question, so the same question asked twice maps to one point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from context_core.knowledge.store import PointRecord, point_id

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.knowledge.memory import KnowledgeMemory

__all__ = [
    "DUPLICATE_COSINE",
    "Feedback",
    "MergeSummary",
    "merge_hot",
    "normalise_terms",
    "on_fallback",
    "run_merge",
]

Feedback = Literal["confirmed", "unconfirmed", "rejected"]
DUPLICATE_COSINE = 0.95
_WS = re.compile(r"\s+")


def normalise_terms(text: str) -> str:
    """NFKC (full-width -> half-width, compatibility forms folded) and collapsed whitespace."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def _query_key(clean_query: str) -> str:
    return "hot-" + hashlib.sha256(clean_query.lower().encode("utf-8")).hexdigest()[:24]


def on_fallback(
    query: str,
    response: str,
    feedback: Feedback | str | None,
    *,
    knowledge: KnowledgeMemory,
    section: str | None = None,
    title: str = "",
) -> str | None:
    """Record a fallback answer in ``hot_knowledge`` (expires after ``CTX_HOT_TTL_HOURS``).

    ``feedback="confirmed"`` marks it for the next merge; ``"rejected"`` stores nothing and
    removes an earlier copy of the same pair. Returns the hot point id (None when rejected).
    """
    fb = (feedback or "unconfirmed").strip().lower()
    if fb not in ("confirmed", "unconfirmed", "rejected"):
        raise ValueError(
            f"feedback must be 'confirmed', 'unconfirmed' or 'rejected', got {feedback!r}"
        )
    gw = knowledge.gateway
    q = normalise_terms(gw.clean_text(query, where="hot:on_fallback"))
    a = normalise_terms(gw.clean_text(response, where="hot:on_fallback"))
    if not q or not a:
        raise ValueError("on_fallback needs a non-empty query and response")
    source = _query_key(q)
    text = f"Q: {q}\nA: {a}"
    # One point per question: an earlier answer to it is replaced (or, if rejected, removed).
    if knowledge.store.info(knowledge.hot) is not None:
        knowledge.store.delete(knowledge.hot, filter={"source": source})
    if fb == "rejected":
        return None
    knowledge.ensure_collections()
    return knowledge.upsert_hot(
        text,
        source=source,
        section=section or "general",
        title=title or q[:120],
        confirmed=fb == "confirmed",
        extra={"kind": "qa", "question_key": q.lower()},
    )


@dataclass(frozen=True, slots=True)
class MergeSummary:
    """Counts of one merge: every hot point seen lands in exactly one bucket."""

    merged: int
    duplicates: int
    expired: int
    kept: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def merge_hot(
    knowledge: KnowledgeMemory,
    *,
    now: float | None = None,
    threshold: float = DUPLICATE_COSINE,
) -> MergeSummary:
    """Move confirmed, unexpired hot points into main; drop expired ones.

    A confirmed point whose nearest main point has cosine >= ``threshold`` is a duplicate: it
    leaves hot without being copied (main already knows it). Unconfirmed, unexpired points
    stay. The search is exact (no HNSW), so points merged earlier in the same run count as
    possible duplicates of later ones.
    """
    store, hot, main = knowledge.store, knowledge.hot, knowledge.main
    if store.info(hot) is None:
        return MergeSummary(0, 0, 0, 0)
    knowledge.ensure_collections()
    cutoff = time.time() if now is None else now
    merged = duplicates = expired = kept = 0
    leave: list[str] = []
    for rec in list(store.scroll(hot, with_vectors=True)):
        p = rec.payload
        if float(p.get("expires_at", 0.0)) < cutoff:
            expired += 1
            leave.append(rec.id)
            continue
        if not p.get("confirmed"):
            kept += 1
            continue
        assert rec.vector is not None
        near = store.search(main, rec.vector, limit=1, exact=True)
        if near and near[0].score >= threshold:
            duplicates += 1
        else:
            payload: dict[str, Any] = {
                k: v for k, v in p.items() if k not in ("expires_at", "confirmed")
            }
            payload["merged_from"] = hot
            payload["merged_at"] = datetime.fromtimestamp(cutoff, UTC).isoformat()
            store.upsert(main, [PointRecord(point_id(str(p["source"]), 0), rec.vector, payload)])
            merged += 1
        leave.append(rec.id)
    if leave:
        store.delete(hot, ids=leave)
    if merged:
        store.optimize(main)
    return MergeSummary(merged=merged, duplicates=duplicates, expired=expired, kept=kept)


def run_merge(settings: Settings, *, now: float | None = None) -> MergeSummary:
    """The daily job: open the store and encoder from settings, merge, close."""
    from context_core.embedding import load_encoder
    from context_core.gateway import Gateway
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.knowledge.store import open_store

    store = open_store(settings)
    try:
        if store.info(settings.collection_hot) is None:
            return MergeSummary(0, 0, 0, 0)
        km = KnowledgeMemory(
            store, load_encoder(settings), settings, Gateway.from_settings(settings)
        )
        return merge_hot(km, now=now)
    finally:
        store.close()
