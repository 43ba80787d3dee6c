"""The hot path: answers confirmed during sessions, kept 72 h, merged into main once a day.

Why a separate collection: an answer an agent gave when L3 had nothing (a *fallback*) may be
right, but nobody has curated it. It lands in ``hot_knowledge`` with an expiry, is searchable at
once, and only a confirmed one graduates into ``knowledge_main``, by the daily merge, unless
main already holds a near-duplicate. Expired hot points are dropped by the same merge.

What is stored is a de-personalised Q/A pair: the gateway strips PII and secrets, terms are
normalised (NFKC folds full-width forms to half-width, whitespace collapses) and the pair's key
is the lower-cased normalised question, so the same question asked twice in one trust scope
maps to one point (scopes: :mod:`context_core.knowledge.memory`).

Trust at the merge: only answers nobody-but-the-platform wrote (system scope) or written under a
shared namespace by an agent that *still* holds ``write`` there graduate into main. An agent's
private answers never do: they serve that agent until they expire. Merged points carry
``merged_from``/``trust = "reviewed"`` and an id from their own UUID namespace
(:func:`merged_point_id`), so they can never overwrite an ingested page's chunk
(``point_id(page_id, i)``), and two different answers never share an id.

Tenancy: ``knowledge_main`` is shared by every organisation of a deployment. A merged point
keeps its hot source's ``namespace`` (its scope) and ``written_by``, so a search on main shows
it only to readers of that scope (:func:`context_core.knowledge.memory.reader_filter`), and the
near-duplicate check looks only at what the scope's readers see (curated points, system
answers, the same namespace's answers): org B's answer is never dropped as a "duplicate" of
org A's (which would leak that A knows it).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from context_core.knowledge.memory import (
    SYSTEM_SCOPE,
    AclSource,
    hot_source,
    reader_filter,
    resolve_hot_scope,
)
from context_core.knowledge.store import PointRecord, SearchQuery, VectorStore

if TYPE_CHECKING:
    from context_core.knowledge.memory import KnowledgeMemory

__all__ = [
    "DUPLICATE_COSINE",
    "Feedback",
    "MergeSummary",
    "merge_eligible",
    "merge_hot",
    "merged_point_id",
    "normalise_terms",
    "on_fallback",
    "unscoped_merged",
]

Feedback = Literal["confirmed", "unconfirmed", "rejected"]
DUPLICATE_COSINE = 0.95
REVIEWED = "reviewed"
_WS = re.compile(r"\s+")
# Merged answers get ids from their own UUID namespace: never equal to point_id(page, i).
_MERGED_NAMESPACE = uuid.UUID("a3c1f0d4-6b2e-4f7a-9d58-2e4c8b1f6a03")
log = logging.getLogger(__name__)


def normalise_terms(text: str) -> str:
    """NFKC (full-width -> half-width, compatibility forms folded) and collapsed whitespace."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def merged_point_id(source: str, content_hash: str) -> str:
    """The id of a merged answer in main: its hot source *and* text, in a UUID namespace of
    its own (so it differs from every ingested ``point_id(page_id, i)``)."""
    return str(uuid.uuid5(_MERGED_NAMESPACE, f"hot:{source}:{content_hash}"))


def on_fallback(
    query: str,
    response: str,
    feedback: Feedback | str | None,
    *,
    knowledge: KnowledgeMemory,
    section: str | None = None,
    title: str = "",
    agent_id: str | None = None,
    namespace: str | None = None,
    namespaces: AclSource | None = None,
) -> str | None:
    """Record a fallback answer in ``hot_knowledge`` (expires after ``CTX_HOT_TTL_HOURS``).

    ``feedback="confirmed"`` marks it for the next merge; ``"rejected"`` stores nothing and
    removes an earlier copy of the same pair (in the same scope only). Returns the hot point
    id (None when rejected). ``agent_id`` is the agent that gave the answer; it lands in its
    private scope unless it holds ``write`` on ``namespace`` (checked with ``namespaces``).
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
    scope = resolve_hot_scope(agent_id, namespace, namespaces)
    key = q.lower()
    text = f"Q: {q}\nA: {a}"
    # One point per question and scope: an earlier answer is replaced (or, if rejected,
    # removed). Another scope's answer to the same question has another source: untouched.
    if knowledge.store.info(knowledge.hot) is not None:
        knowledge.store.delete(knowledge.hot, filter={"source": hot_source(scope, key)})
    if fb == "rejected":
        return None
    knowledge.ensure_collections()
    return knowledge.upsert_hot(
        text,
        key=key,
        section=section or "general",
        title=title or q[:120],
        confirmed=fb == "confirmed",
        extra={"kind": "qa", "question_key": key},
        written_by=agent_id,
        namespace=scope if scope != SYSTEM_SCOPE and ":" not in scope else None,
        namespaces=namespaces,
    )


@dataclass(frozen=True, slots=True)
class MergeSummary:
    """Counts of one merge: every hot point seen lands in exactly one bucket.

    ``kept`` = stays in hot: unconfirmed, or confirmed but not eligible for main (see
    :func:`merge_eligible`); both wait there until they expire.
    """

    merged: int
    duplicates: int
    expired: int
    kept: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def merge_eligible(
    payload: dict[str, Any],
    namespaces: AclSource | None,
    *,
    acl_cache: dict[str, Any] | None = None,
) -> bool:
    """May this (confirmed) hot point become reviewed knowledge in main?

    Yes for a system write (no agent); for a shared-namespace write only while the writer
    holds ``write`` on that namespace (needs ``namespaces``); never for an agent's private
    answer or a point without trust fields (written before scopes existed).
    """
    scope = payload.get("namespace")
    writer = payload.get("written_by") or None
    if scope == SYSTEM_SCOPE:
        return writer is None
    if not isinstance(scope, str) or ":" in scope or writer is None or namespaces is None:
        return False
    cache = acl_cache if acl_cache is not None else {}
    try:
        if scope not in cache:
            cache[scope] = namespaces.acl(scope)
    except Exception as e:  # an ACL we cannot read merges nothing shared
        log.warning("hot merge: ACL of namespace %r unavailable: %s", scope, e)
        return False
    grant = cache[scope].get(str(writer))
    return grant is not None and bool(grant.write)


def merge_hot(
    knowledge: KnowledgeMemory,
    *,
    now: float | None = None,
    threshold: float = DUPLICATE_COSINE,
    namespaces: AclSource | None = None,
) -> MergeSummary:
    """Move confirmed, eligible, unexpired hot points into main; drop expired ones.

    A confirmed point whose nearest main point *among those its scope's readers see* (a
    curated point, a system answer, or an answer merged from the same namespace:
    :func:`reader_filter`) has cosine >= ``threshold`` is a duplicate: it leaves hot without
    being copied (main already knows it). Another namespace's answers are never compared.
    Unconfirmed or ineligible (:func:`merge_eligible`, using ``namespaces`` for the grants)
    unexpired points stay. The search is exact (no HNSW), so points merged earlier in the
    same run count as possible duplicates of later ones.
    """
    store, hot, main = knowledge.store, knowledge.hot, knowledge.main
    if store.info(hot) is None:
        return MergeSummary(0, 0, 0, 0)
    knowledge.ensure_collections()
    cutoff = time.time() if now is None else now
    merged = duplicates = expired = kept = held = 0
    leave: list[str] = []
    acls: dict[str, Any] = {}
    for rec in list(store.scroll(hot, with_vectors=True)):
        p = rec.payload
        if float(p.get("expires_at", 0.0)) < cutoff:
            expired += 1
            leave.append(rec.id)
            continue
        if not p.get("confirmed"):
            kept += 1
            continue
        if not merge_eligible(p, namespaces, acl_cache=acls):
            kept += 1
            held += 1
            continue
        assert rec.vector is not None
        # per scope: another organisation's answer is neither a reason to drop this one nor
        # something this merge may reveal the existence of; system answers every reader sees
        same_scope = reader_filter(sorted({SYSTEM_SCOPE, str(p["namespace"])}))
        near = store.search(rec.vector, SearchQuery(main, 1, same_scope, exact=True))
        if near and near[0].score >= threshold:
            duplicates += 1
        else:
            payload: dict[str, Any] = {
                k: v for k, v in p.items() if k not in ("expires_at", "confirmed")
            }
            payload["merged_from"] = hot
            payload["merged_at"] = datetime.fromtimestamp(cutoff, UTC).isoformat()
            payload["trust"] = REVIEWED
            pid = merged_point_id(str(p.get("source", "")), str(p.get("content_hash") or rec.id))
            # the hot point's own sparse vector when both collections cut terms the same way;
            # else (or when it has none) made from its text with main's encoder
            main_sparse = knowledge.sparse_for(main)
            same = knowledge.sparse_for(hot).name == main_sparse.name
            sparse = rec.sparse if same else None
            if sparse is None and isinstance(p.get("text"), str):
                sparse = main_sparse.encode_documents([p["text"]])[0]
            store.upsert(main, [PointRecord(pid, rec.vector, payload, sparse)])
            merged += 1
        leave.append(rec.id)
    if leave:
        store.delete(hot, ids=leave)
    if merged:
        store.optimize(main)
    if held:
        log.info("hot merge: %d confirmed answer(s) held (private or unauthorised scope)", held)
    return MergeSummary(merged=merged, duplicates=duplicates, expired=expired, kept=kept)


def unscoped_merged(store: VectorStore, main: str, *, delete: bool = False) -> list[str]:
    """Ids of the merged answers in main that carry no ``namespace`` (merged before merges
    kept their hot source's scope, so nobody can say which organisation they belong to);
    with ``delete`` they are deleted too. Readers never see them
    (:func:`context_core.knowledge.memory.reader_filter`); curated points (no
    ``merged_from``) are never touched. ``ctx unscoped-merged`` runs this."""
    if store.info(main) is None:
        return []
    ids = [
        rec.id
        for rec in store.scroll(main, filter={"namespace": {"empty": True}}, batch=1024)
        if rec.payload.get("merged_from") not in (None, "", [])
    ]
    if delete and ids:
        store.delete(main, ids=ids)
        log.info("deleted %d unscoped merged answer(s) from %s", len(ids), main)
    return ids
