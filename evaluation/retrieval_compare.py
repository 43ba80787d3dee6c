"""Dense-only vs sparse-only vs hybrid retrieval, and cosine vs ``p_relevant``, in one run.

One BEIR folder in, one report out (``reports/retrieval_<dataset>.{md,json,png}``):

1. **Index once.** Every document is cut into chunks of the embedding model's window (token
   boundaries, the title leading every chunk as ingestion's context line does): what
   ingestion would store for a page, and the same text for the dense and the sparse vector.
   The chunks go into a scratch Qdrant Edge collection under ``<data_dir>/scratch/``
   (deleted afterwards) with both vectors.
2. **Retrieve per mode.** Each judged query runs in every available mode through
   :class:`~context_core.knowledge.memory.KnowledgeMemory` (the router's L3 call, on a
   scratch platform from ``build_platform``), query embeddings computed beforehand (as with
   the embedding cache). Chunks are folded into
   documents by their best chunk, the top ``k`` documents kept. Modes are timed round-robin
   per query, so each sees the same machine load.
3. **Score.** nDCG@k (graded qrels), recall@k and MRR@k per query, with percentile-bootstrap
   95 % intervals over queries (:mod:`evaluation.retrieval_metrics`).
4. **Confidence signal.** The top-k hits of each mode are labelled from the qrels. Queries are
   split (seeded) into train and held-out halves; the relevance model
   (:mod:`context_core.routing.relevance`) is fitted on the train queries' hits only, and cosine and
   ``p_relevant`` are compared on the held-out queries only: AUC with a query-bootstrap
   interval, Brier score, and the precision of ``confident`` hits at each signal's accept
   threshold (the calibration's criterion, fitted on the train hits).

The report is written by :mod:`evaluation.retrieval_report`. A mode that cannot run is
skipped with the reason in the report; nothing is estimated in its place.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evaluation.beir import BeirDataset, _progress, _safe_name, load_beir
from evaluation.calibration import Interval
from evaluation.retrieval_metrics import (
    auc,
    bootstrap_ci,
    grouped_auc_ci,
    mrr_at_k,
    ndcg_at_k,
    paired_ratio_ci,
    recall_at_k,
    split_queries,
)
from evaluation.retrieval_results import (
    FULL_LOGISTIC,
    HEADLINE_MODE,
    ComparisonRun,
    ConfidenceResult,
    Goal,
    ModeResult,
    OperatingPoint,
)

if TYPE_CHECKING:
    from context_core.config import Settings
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.store import Hit

__all__ = [
    "GOAL_AUC",
    "GOAL_RECALL_RATIO",
    "MODES",
    "ComparisonRun",
    "ConfidenceResult",
    "Goal",
    "ModeResult",
    "compare_retrieval",
    "confidence_signal",
    "doc_chunks",
    "fold_chunks",
    "score_mode",
]

MODES: tuple[str, ...] = ("dense", "sparse", "hybrid")
FUSIONS: tuple[str, ...] = ("rrf", "weighted")  # "hybrid:<fusion>" overrides CTX_HYBRID_FUSION
GOAL_RECALL_RATIO = 1.15  # hybrid recall@k >= 1.15 x dense-only (issue 14)
GOAL_AUC = 0.80  # AUC of the confidence signal (issue 14)
RELIABILITY_BINS = 10


# --- chunks and documents --------------------------------------------------------------------


def doc_chunks(encoder: Any, title: str, text: str) -> list[str]:
    """The document as ingestion would store it: consecutive pieces of the text cut on token
    boundaries, each led by the title (ingestion's context line, at most a quarter of the
    window), title + piece within the model's window (minus [CLS]/[SEP])."""
    budget = max(1, int(encoder.max_tokens) - 2)
    try:
        title_offsets = encoder.token_offsets(title) if title else []
        offsets = encoder.token_offsets(text)
    except Exception:  # no fast tokenizer: one piece, the model truncates
        return [f"{title}\n{text}" if title else text]
    if len(title_offsets) > budget // 4:
        title = title[: title_offsets[budget // 4 - 1][1]] if budget >= 4 else ""
        title_offsets = title_offsets[: budget // 4]
    head = f"{title}\n" if title else ""
    body = max(1, budget - len(title_offsets))
    if len(offsets) <= body:
        return [head + text]
    pieces = []
    for start in range(0, len(offsets), body):
        window = offsets[start : start + body]
        a = window[0][0] if start else 0
        piece = text[a : window[-1][1]]
        if piece.strip():
            pieces.append(head + piece)
    return pieces or [head + text]


def fold_chunks(hits: Sequence[Hit], k: int) -> list[Hit]:
    """Chunk hits -> document hits: each document once, at its best (first) chunk's place,
    the top ``k`` kept; ``rank`` renumbered 1..k so it is the document's rank."""
    out: list[Hit] = []
    seen: set[str] = set()
    for h in hits:
        doc = str((h.payload or {}).get("source", ""))
        if doc in seen:
            continue
        seen.add(doc)
        out.append(_with_rank(h, len(out) + 1))
        if len(out) == k:
            break
    return out


def _with_rank(hit: Hit, rank: int) -> Hit:
    return dataclasses.replace(hit, rank=rank)


_NAN_CI = Interval(float("nan"), float("nan"), 0.95)


# --- scoring ------------------------------------------------------------------------------


def score_mode(
    mode: str,
    ranked: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    latencies_ms: Sequence[float],
    *,
    k: int = 10,
    n_boot: int = 1000,
    seed: int = 0,
) -> ModeResult:
    """Per-query nDCG/recall/MRR at ``k`` for one mode, means and bootstrap intervals.
    ``ranked`` maps query id -> document ids in rank order (every judged query)."""
    qids = tuple(ranked)
    per_query = {
        "ndcg": np.array([ndcg_at_k(ranked[q], qrels[q], k) for q in qids]),
        "recall": np.array([recall_at_k(ranked[q], qrels[q], k) for q in qids]),
        "mrr": np.array([mrr_at_k(ranked[q], qrels[q], k) for q in qids]),
    }
    mean = {m: float(v.mean()) if len(v) else float("nan") for m, v in per_query.items()}
    ci = {m: bootstrap_ci(v, n_boot=n_boot, seed=seed) for m, v in per_query.items()}
    return ModeResult(mode, k, qids, per_query, mean, ci, _latency_summary(latencies_ms))


def _latency_summary(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {"p50": float("nan"), "p99": float("nan"), "mean": float("nan"), "n": 0}
    s = sorted(samples)
    p99 = s[max(0, min(len(s) - 1, math.ceil(0.99 * len(s)) - 1))]  # nearest rank
    return {"p50": statistics.median(s), "p99": p99, "mean": statistics.fmean(s), "n": len(s)}


def _operating_point(
    signal: str,
    threshold: float,
    scores: np.ndarray,
    labels: np.ndarray,
    groups: Sequence[str],
    *,
    n_boot: int,
    seed: int,
) -> OperatingPoint:
    admitted = scores >= threshold
    n_adm = int(admitted.sum())
    tp = int((admitted & (labels == 1)).sum())
    n_pos = int((labels == 1).sum())
    precision = tp / n_adm if n_adm else float("nan")
    # query-bootstrap interval of the precision of the admitted hits
    by_q: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_q.setdefault(g, []).append(i)
    members = [np.array(v) for v in by_q.values()]
    draws: list[float] = []
    if n_boot and members:
        rng = np.random.default_rng(seed)
        for _ in range(n_boot):
            idx = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
            a = admitted[idx]
            if a.any():
                draws.append(float(labels[idx][a].mean()))
    if draws:
        lo, hi = np.percentile(draws, [2.5, 97.5])
        ci = Interval(float(lo), float(hi), 0.95)
    else:
        ci = _NAN_CI
    return OperatingPoint(
        signal=signal,
        threshold=float(threshold),
        precision=precision,
        precision_ci=ci,
        recall=tp / n_pos if n_pos else float("nan"),
        false_positive_rate=(n_adm - tp) / (len(scores) - n_pos)
        if len(scores) > n_pos
        else float("nan"),
        admitted_share=n_adm / len(scores) if len(scores) else float("nan"),
        n_admitted=n_adm,
    )


def _accept_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The calibration's accept criterion (highest Youden J), on the train hits."""
    from evaluation.calibration import calibrate

    return calibrate(scores, labels, n_boot=0).accept


def _precision_at_recall(scores: np.ndarray, labels: np.ndarray, recall: float) -> float | None:
    """Precision of the shortest top-by-score list reaching ``recall`` of the relevant hits."""
    n_pos = int(labels.sum())
    if n_pos == 0 or math.isnan(recall):
        return None
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(labels[order])
    need = max(1, math.ceil(recall * n_pos - 1e-9))
    i = int(np.searchsorted(tp, need))  # first position where tp reaches need
    return float(tp[i] / (i + 1)) if i < len(tp) else None


def _reliability(p: np.ndarray, y: np.ndarray, bins: int = RELIABILITY_BINS):
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    mean_p = np.full(bins, np.nan)
    frac = np.full(bins, np.nan)
    count = np.zeros(bins, dtype=int)
    for b in range(bins):
        m = which == b
        count[b] = int(m.sum())
        if count[b]:
            mean_p[b] = float(p[m].mean())
            frac[b] = float(y[m].mean())
    return mean_p, frac, count


def _roc_points(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(labels, scores)
    return fpr, tpr


def confidence_signal(
    mode: str,
    hits: Mapping[str, Sequence[Hit]],
    labels: Mapping[str, Sequence[int]],
    query_len: Mapping[str, int],
    *,
    train_share: float = 0.5,
    seed: int = 0,
    n_boot: int = 1000,
    kind: str = "auto",
) -> ConfidenceResult:
    """Cosine vs ``p_relevant`` on held-out queries. ``hits``/``labels``: query id -> the
    mode's top-k document hits and their 0/1 relevance.

    The relevance model is fitted on the train queries' hits by the production fitting job
    (:func:`evaluation.relevance_calibration.fit_relevance`: ``kind`` "auto" lets it choose
    among its candidates by out-of-fold Brier, another value names the one candidate; its
    accept threshold on ``p_relevant`` comes from out-of-fold probabilities). When it picks a
    cosine-only map, a logistic model over every feature is scored too, as a reference
    (:data:`FULL_LOGISTIC`). The cosine accept threshold is the calibration's on the
    same train hits. Every figure is on the held-out queries' hits."""
    qids = [q for q in hits if hits[q]]
    train_q, test_q = split_queries(qids, train_share=train_share, seed=seed)

    def rows(qs: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        s = [float(h.score) for q in qs for h in hits[q]]
        y = [int(v) for q in qs for v in labels[q]]
        g = [q for q in qs for _ in hits[q]]
        return np.array(s, dtype=float), np.array(y, dtype=int), g

    s_tr, y_tr, _ = rows(train_q)
    s_te, y_te, g_te = rows(test_q)
    aucs: dict[str, float] = {}
    cis: dict[str, Interval] = {}
    roc: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    operating: dict[str, OperatingPoint] = {}
    base: dict[str, Any] = {
        "mode": mode,
        "n_train_queries": len(train_q),
        "n_test_queries": len(test_q),
        "n_train_hits": len(s_tr),
        "n_test_hits": len(s_te),
        "n_test_relevant": int(y_te.sum()),
    }
    two_class = 0 < y_te.sum() < len(y_te) and 0 < y_tr.sum() < len(y_tr)
    if not two_class:
        return ConfidenceResult(
            **base, auc={}, auc_ci={}, brier=None, operating={}, precision_at_cosine_recall=None,
            model_kind=None, skipped="train or held-out hits are all of one class",
            roc={}, reliability=None,
        )  # fmt: skip
    aucs["cosine"] = auc(s_te, y_te)
    cis["cosine"] = grouped_auc_ci(s_te, y_te, g_te, n_boot=n_boot, seed=seed)
    roc["cosine"] = _roc_points(s_te, y_te)
    operating["cosine"] = _operating_point(
        "cosine", _accept_threshold(s_tr, y_tr), s_te, y_te, g_te, n_boot=n_boot, seed=seed
    )
    import pandas as pd

    from context_core.routing.relevance import RelevanceModel, hit_features
    from evaluation.labels import LabelSet
    from evaluation.relevance_calibration import fit_relevance

    def features(qs: Sequence[str]) -> np.ndarray:
        return np.vstack([hit_features(list(hits[q]), query_len[q]) for q in qs])

    X_tr, X_te = features(train_q), features(test_q)
    # the train hits as a labels file would hold them: the production fitting job
    # (kind chosen by out-of-fold Brier, folds by query; accept/skip on out-of-fold p)
    frame = pd.DataFrame(
        {
            "query_id": [q for q in train_q for _ in hits[q]],
            "similarity": X_tr[:, 0],
            "sparse_score": X_tr[:, 1],
            "rank": X_tr[:, 2],
            "margin": X_tr[:, 3],
            "query_len": X_tr[:, 4],
            "label": y_tr,
        }
    )
    choice: dict[str, Any] = {} if kind == "auto" else {"candidates": (kind,)}
    fit = fit_relevance(
        LabelSet(frame=frame, sha256="", path=None), model="", dataset=mode,
        retrieval_mode=mode.partition(":")[0], seed=seed, n_boot=0, **choice,
    )  # fmt: skip
    kind = str(getattr(fit, "chosen", fit.kind))
    p_te = np.asarray(fit.model.predict(X_te), dtype=float)
    aucs["p_relevant"] = auc(p_te, y_te)
    cis["p_relevant"] = grouped_auc_ci(p_te, y_te, g_te, n_boot=n_boot, seed=seed)
    roc["p_relevant"] = _roc_points(p_te, y_te)
    if kind != "logistic" and len(fit.present) > 1:
        # the job preferred a cosine-only map: show what every feature would have given
        full = RelevanceModel.fit(X_tr, y_tr, "logistic", features=fit.present)
        p_full = np.asarray(full.predict(X_te), dtype=float)
        aucs[FULL_LOGISTIC] = auc(p_full, y_te)
        cis[FULL_LOGISTIC] = grouped_auc_ci(p_full, y_te, g_te, n_boot=n_boot, seed=seed)
        roc[FULL_LOGISTIC] = _roc_points(p_full, y_te)
    brier = float(np.mean((p_te - y_te) ** 2))
    reliability = _reliability(p_te, y_te)
    accept_p = fit.model.accept if fit.model.accept is not None else 0.5
    operating["p_relevant"] = _operating_point(
        "p_relevant", accept_p, p_te, y_te, g_te, n_boot=n_boot, seed=seed
    )
    p_at_r = _precision_at_recall(p_te, y_te, operating["cosine"].recall)
    return ConfidenceResult(
        **base, auc=aucs, auc_ci=cis, brier=brier, operating=operating,
        precision_at_cosine_recall=p_at_r, model_kind=kind,
        skipped=None, roc=roc, reliability=reliability,
    )  # fmt: skip


def goals_for(
    modes: Mapping[str, ModeResult],
    confidence: Mapping[str, ConfidenceResult],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Goal, ...]:
    """The issue's two goals, read on this run (``passed`` None when not measurable)."""
    target = f">= {GOAL_RECALL_RATIO:.2f} x dense-only"
    if "hybrid" in modes and "dense" in modes:
        h, d = modes["hybrid"], modes["dense"]
        ratio, ci = paired_ratio_ci(
            h.per_query["recall"], d.per_query["recall"], n_boot=n_boot, seed=seed
        )
        g1 = Goal(
            "hybrid recall@k / dense-only recall@k", target, ratio, ci,
            None if math.isnan(ratio) else ratio >= GOAL_RECALL_RATIO,
            "paired bootstrap over queries",
        )  # fmt: skip
    else:
        g1 = Goal("hybrid recall@k / dense-only recall@k", target, float("nan"), None, None,
                  "hybrid or dense mode not available")  # fmt: skip
    c = confidence.get(HEADLINE_MODE)
    if c is not None and "p_relevant" in c.auc:
        a = c.auc["p_relevant"]
        g2 = Goal(f"AUC of p_relevant ({HEADLINE_MODE} hits, held-out queries)",
                  f">= {GOAL_AUC:.2f}", a, c.auc_ci["p_relevant"], a >= GOAL_AUC,
                  f"cosine AUC on the same hits {c.auc['cosine']:.3f}")  # fmt: skip
    else:
        why = c.skipped if c is not None else f"{HEADLINE_MODE} mode not available"
        g2 = Goal(f"AUC of p_relevant ({HEADLINE_MODE} hits, held-out queries)",
                  f">= {GOAL_AUC:.2f}", float("nan"), None, None, why or "")  # fmt: skip
    return (g1, g2)


# --- the run --------------------------------------------------------------------------------


def _sparse_support() -> tuple[Any, str | None]:
    """(sparse module, None) or (None, why sparse/hybrid cannot run on this library)."""
    from context_core.knowledge import sparse

    return sparse, None


def compare_retrieval(
    path: Path | str,
    settings: Settings,
    *,
    k: int = 10,
    model: str | None = None,
    limit_queries: int | None = None,
    limit_docs: int | None = None,
    split: str = "test",
    modes: Sequence[str] = MODES,
    n_boot: int = 1000,
    seed: int = 0,
    train_share: float = 0.5,
    relevance_kind: str = "auto",
    progress: bool = True,
    batch: int = 64,
    write_report: bool = True,
    log: Callable[[str], None] | None = None,
) -> ComparisonRun:
    """BEIR folder -> scratch collection (dense + sparse) -> every mode -> metrics -> report."""
    from context_core.knowledge.store import PointRecord, point_id
    from context_core.platform import build_platform

    unknown = [m for m in modes if not _valid_mode(m)]
    if unknown or not modes:
        raise ValueError(
            f"unknown retrieval mode(s) {unknown}; choose from {', '.join(MODES)} (hybrid may "
            f"name its fusion: {', '.join(f'hybrid:{f}' for f in FUSIONS)}, and its feedback "
            "hits: hybrid:weighted:0)"
        )
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    dataset: BeirDataset = load_beir(
        path, split=split, limit_queries=limit_queries, limit_docs=limit_docs
    )
    run_settings = settings.model_copy(update={"embed_model": model}) if model else settings
    sparse_mod, no_sparse = _sparse_support()
    skipped: dict[str, str] = {}
    if no_sparse:
        for m in modes:
            if m != "dense":
                skipped[m] = no_sparse
                say(f"skipping {m} retrieval: {no_sparse}")
    run_modes = [m for m in modes if m not in skipped]
    collection = f"compare_{_safe_name(dataset.name)}"
    scratch_root = Path(settings.data_dir) / "scratch"
    scratch_root.mkdir(parents=True, exist_ok=True)

    ranked: dict[str, dict[str, list[str]]] = {m: {} for m in run_modes}
    doc_hits: dict[str, dict[str, list[Hit]]] = {m: {} for m in run_modes}
    lat: dict[str, list[float]] = {m: [] for m in run_modes}
    timings: dict[str, float] = {}
    n_chunks = 0
    empty_sparse = 0
    with tempfile.TemporaryDirectory(prefix="compare-", dir=scratch_root) as tmp:
        # the scratch platform: embedded Qdrant Edge under tmp, no Redis, no embedding cache
        scratch = run_settings.model_copy(
            update={"data_dir": Path(tmp), "qdrant_url": None, "edge_socket": None,
                    "collection_main": collection, "collection_hot": f"{collection}_hot"}
        )  # fmt: skip
        platforms: dict[str, Any] = {}

        def platform_for(mode: str) -> Any:
            """One platform per hybrid variant (the settings its L3 search reads)."""
            variant = mode.partition(":")[2]
            if variant not in platforms:
                update = _variant_settings(variant)
                s = scratch.model_copy(update=update) if update else scratch
                platforms[variant] = build_platform(s, embed_cache=False, ensure_collections=False)
            return platforms[variant]

        try:
            base = platform_for("")
            encoder = base.encoder
            store = base.store
            timings["load"] = time.perf_counter() - t_start
            t0 = time.perf_counter()
            sparse_encoder = base.knowledge.sparse if sparse_mod else None
            _create(store, collection, encoder, sparse_encoder)
            items = [
                (doc_id, i, piece)
                for doc_id, (title, text) in dataset.corpus.items()
                for i, piece in enumerate(doc_chunks(encoder, title, text))
            ]
            n_chunks = len(items)
            with _progress(progress) as bar:
                task = bar.add_task(
                    f"embedding {dataset.name}: {len(dataset.corpus)} docs, {n_chunks} chunks",
                    total=n_chunks,
                )
                for start in range(0, n_chunks, batch):
                    part = items[start : start + batch]
                    texts = [t for _, _, t in part]
                    vectors = encoder.encode(texts)
                    sparse_vecs = (
                        sparse_encoder.encode_documents(texts)
                        if sparse_encoder is not None
                        else [None] * len(part)
                    )
                    points = []
                    for (doc_id, i, t), vec, sv in zip(part, vectors, sparse_vecs, strict=True):
                        payload = {"source": doc_id, "chunk_index": i, "section": dataset.name,
                                   "text": t[:300]}  # fmt: skip
                        extra = {"sparse": sv} if sv is not None else {}
                        points.append(
                            PointRecord(point_id(doc_id, i), vec.tolist(), payload, **extra)
                        )
                    store.upsert(collection, points)
                    bar.advance(task, len(part))
            store.optimize(collection)
            timings["index"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            texts = list(dataset.queries.values())
            qvec = dict(zip(texts, encoder.encode(texts), strict=True))
            timings["embed_queries"] = time.perf_counter() - t0
            fetch = k * max(1, max(i for _, i, _ in items) + 1)  # k documents even if chunked
            fetch = min(fetch, 100)

            def search(mode: str, text: str) -> list[Hit]:
                km = platform_for(mode).knowledge
                return _search(km, mode.partition(":")[0], qvec[text], text, fetch)

            t0 = time.perf_counter()
            first = texts[0]
            for _ in range(3):  # warm-up: shard caches, the sparse tokenizer
                for m in run_modes:
                    search(m, first)
            pc = time.perf_counter
            with _progress(progress) as bar:
                task = bar.add_task(
                    f"retrieving {dataset.name}: {len(texts)} queries x {len(run_modes)} modes",
                    total=len(texts),
                )
                for qid, text in dataset.queries.items():
                    for m in run_modes:
                        t_q = pc()
                        got = search(m, text)
                        lat[m].append((pc() - t_q) * 1000.0)
                        top = fold_chunks(got, k)
                        doc_hits[m][qid] = top
                        ranked[m][qid] = [str(h.payload.get("source", "")) for h in top]
                    bar.advance(task)
            timings["retrieve"] = time.perf_counter() - t0
            if sparse_encoder is not None:  # such a query ran as dense in every mode
                empty_sparse = sum(not len(sparse_encoder.encode_query(t)) for t in texts)
        finally:
            for p in reversed(list(platforms.values())):
                p.close()

    t0 = time.perf_counter()
    results = {
        m: score_mode(m, ranked[m], dataset.qrels, lat[m], k=k, n_boot=n_boot, seed=seed)
        for m in run_modes
    }
    from context_core.routing.relevance import query_length  # as the router counts it

    qlen = {q: query_length(t) for q, t in dataset.queries.items()}
    confidence: dict[str, ConfidenceResult] = {}
    for m in run_modes:
        labels = {q: [int(dataset.qrels[q].get(d, 0) > 0) for d in ranked[m][q]] for q in ranked[m]}
        confidence[m] = confidence_signal(
            m, doc_hits[m], labels, qlen, train_share=train_share, seed=seed, n_boot=n_boot,
            kind=relevance_kind,
        )  # fmt: skip
    timings["score"] = time.perf_counter() - t0
    run = ComparisonRun(
        dataset=dataset.name,
        model=encoder.name,
        k=k,
        n_docs=len(dataset.corpus),
        n_chunks=n_chunks,
        n_queries=len(dataset.queries),
        seed=seed,
        n_boot=n_boot,
        train_share=train_share,
        modes=results,
        skipped_modes=skipped,
        confidence=confidence,
        goals=goals_for(results, confidence, n_boot=n_boot, seed=seed),
        settings_used=_retrieval_settings(run_settings, fetch, empty_sparse),
        timings_s=timings,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    if write_report:
        from evaluation.retrieval_report import write_comparison_report

        run = run.with_report(write_comparison_report(run, Path(settings.reports_dir)))
    return run


def _valid_mode(mode: str) -> bool:
    """``dense``, ``sparse``, ``hybrid``, ``hybrid:<fusion>`` or ``hybrid:<fusion>:<N>`` (N
    feedback hits, 0 = none)."""
    base, sep, variant = mode.partition(":")
    if base not in MODES or (sep and base != "hybrid"):
        return False
    try:
        _variant_settings(variant)
    except ValueError:
        return False
    return True


def _variant_settings(variant: str) -> dict[str, Any]:
    """The settings a hybrid variant (``<fusion>[:<feedback>]``) overrides; ValueError when it
    names neither."""
    if not variant:
        return {}
    fusion, sep, feedback = variant.partition(":")
    if fusion not in FUSIONS:
        raise ValueError(f"unknown fusion {fusion!r}")
    update: dict[str, Any] = {"hybrid_fusion": fusion}
    if sep:
        if not feedback.isdigit() or int(feedback) > 20:
            raise ValueError(f"feedback must be 0-20, got {feedback!r}")
        update["hybrid_feedback"] = int(feedback)
    return update


def _retrieval_settings(settings: Settings, fetch: int, empty_sparse: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "chunk_hits_fetched_per_query": fetch,
        "queries_without_sparse_terms": empty_sparse,
    }
    for name in ("retrieval_mode", "hybrid_fusion", "hybrid_feedback"):
        if hasattr(settings, name):
            out[name] = getattr(settings, name)
    return out


# --- the seam to the library's sparse / hybrid API ---------------------------------------------


def _create(store: Any, name: str, encoder: Encoder, sparse_encoder: Any) -> None:
    if sparse_encoder is not None:
        store.create_collection(
            name, dim=encoder.dim, model=encoder.name, sparse=sparse_encoder.name
        )
    else:
        store.create_collection(name, dim=encoder.dim, model=encoder.name)


def _search(km: Any, mode: str, vector: np.ndarray, text: str, limit: int) -> list[Hit]:
    """The router's L3 call with the query embedding already at hand (the embedding cache's
    case): sparse/hybrid encode the query's terms from ``text``."""
    if mode == "dense" and "mode" not in inspect.signature(km.search_vector).parameters:
        return list(km.search_vector(vector, limit=limit, include_hot=False))
    return list(km.search_vector(vector, limit=limit, include_hot=False, mode=mode, query=text))
