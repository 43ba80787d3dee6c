"""Ranking and separation metrics over plain inputs, with bootstrap intervals over queries.

Pure functions: a ranked list of document ids and a query's graded qrels in, a number out.
Conventions (those of trec_eval / BEIR's ``evaluation.py``):

* a document is **relevant** when its qrel grade is > 0; unjudged documents count as grade 0;
* nDCG uses the grade itself as gain and ``1 / log2(rank + 1)`` as discount; the ideal DCG
  ranks *all* judged relevant documents of the query (retrieved or not), so a query whose
  relevant documents were not found scores 0, not NaN;
* recall@k is the share of the query's relevant documents found in the top k;
* MRR@k is ``1 / rank`` of the first relevant document in the top k (0 when none).

Intervals are percentile bootstraps **over queries** (hits of one query are not independent
draws, so AUC resamples whole queries too), seeded so a report is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from evaluation.calibration import Interval

__all__ = [
    "RANKING_METRICS",
    "auc",
    "bootstrap_ci",
    "dcg",
    "grouped_auc_ci",
    "mrr_at_k",
    "ndcg_at_k",
    "paired_ratio_ci",
    "ranking_metric",
    "recall_at_k",
    "split_queries",
]


def _check_k(k: int) -> None:
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")


def dcg(gains: Sequence[float]) -> float:
    """Discounted cumulative gain: ``sum(g_i / log2(i + 1))`` for 1-based positions ``i``."""
    return float(sum(g / math.log2(i + 1) for i, g in enumerate(gains, start=1)))


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k with graded relevance; 0.0 for a query with no relevant document judged."""
    _check_k(k)
    gains = [max(0, qrels.get(d, 0)) for d in ranked[:k]]
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    best = dcg(ideal)
    return dcg(gains) / best if best > 0 else 0.0


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """Share of the relevant documents (grade > 0) found in the top k; 0.0 if none exist."""
    _check_k(k)
    relevant = {d for d, g in qrels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    """Reciprocal rank of the first relevant document in the top k (0.0 when there is none)."""
    _check_k(k)
    for rank, d in enumerate(ranked[:k], start=1):
        if qrels.get(d, 0) > 0:
            return 1.0 / rank
    return 0.0


RANKING_METRICS: Mapping[str, Callable[[Sequence[str], Mapping[str, int], int], float]] = {
    "ndcg": ndcg_at_k,
    "recall": recall_at_k,
    "mrr": mrr_at_k,
}


def ranking_metric(name: str) -> Callable[[Sequence[str], Mapping[str, int], int], float]:
    """The metric function for ``name`` (``ndcg``, ``recall``, ``mrr``); unknown names raise."""
    try:
        return RANKING_METRICS[name]
    except KeyError:
        raise ValueError(
            f"unknown ranking metric {name!r}; choose one of {', '.join(RANKING_METRICS)}"
        ) from None


def auc(scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney probability that a random relevant item outscores a random
    irrelevant one (ties count one half). Raises ValueError when a class is missing."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=int)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores and labels must be 1-D and equally long ({s.shape}, {y.shape})")
    n_pos = int((y == 1).sum())
    n_neg = int((y == 0).sum())
    if n_pos + n_neg != len(y):
        raise ValueError("labels must be 0 or 1")
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes (got {n_pos} positive, {n_neg} negative)")
    ranks = _average_ranks(s)
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def _average_ranks(s: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their positions."""
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    new_run = np.r_[True, sorted_s[1:] != sorted_s[:-1]]  # runs of equal values, sorted order
    run_of = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:], len(s)]
    ranks = np.empty(len(s), dtype=float)
    ranks[order] = ((starts + 1 + ends) / 2)[run_of]  # mean of positions start+1 .. end
    return ranks


def _percentile_interval(draws: Sequence[float], level: float) -> Interval:
    if not draws:
        return Interval(float("nan"), float("nan"), level)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(np.asarray(draws, dtype=float), [tail, 100 - tail])
    return Interval(float(lo), float(hi), level)


def _check_boot(n_boot: int, level: float) -> None:
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap interval of the mean of per-query ``values`` (queries resampled
    with replacement). ``n_boot=0`` or no values gives a NaN interval."""
    _check_boot(n_boot, level)
    v = np.asarray(values, dtype=float)
    if n_boot == 0 or len(v) == 0:
        return Interval(float("nan"), float("nan"), level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(n_boot, len(v)))
    return _percentile_interval(v[idx].mean(axis=1).tolist(), level)


def paired_ratio_ci(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, Interval]:
    """``mean(numerator) / mean(denominator)`` over the same queries, and its paired bootstrap
    interval (each resample draws the same queries for both). NaN when a mean is 0."""
    _check_boot(n_boot, level)
    a = np.asarray(numerator, dtype=float)
    b = np.asarray(denominator, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("numerator and denominator must be per-query values of the same queries")

    def ratio(x: np.ndarray, y: np.ndarray) -> float:
        d = float(y.mean()) if len(y) else 0.0
        return float(x.mean()) / d if d > 0 else float("nan")

    point = ratio(a, b)
    if n_boot == 0 or len(a) == 0:
        return point, Interval(float("nan"), float("nan"), level)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(a), len(a))
        r = ratio(a[idx], b[idx])
        if not math.isnan(r):
            draws.append(r)
    return point, _percentile_interval(draws, level)


def grouped_auc_ci(
    scores: Sequence[float] | np.ndarray,
    labels: Sequence[int] | np.ndarray,
    groups: Sequence[Hashable],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Bootstrap interval of :func:`auc`, resampling whole groups (the queries the hits came
    from) with replacement; one-class resamples are skipped."""
    _check_boot(n_boot, level)
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=int)
    if len(groups) != len(s):
        raise ValueError("groups must name the group of every score")
    if n_boot == 0 or len(s) == 0:
        return Interval(float("nan"), float("nan"), level)
    names = list(dict.fromkeys(groups))
    index = {g: i for i, g in enumerate(names)}
    gid = np.fromiter((index[g] for g in groups), dtype=int, count=len(groups))
    order = np.argsort(gid, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(gid, minlength=len(names)))]
    members = [order[bounds[i] : bounds[i + 1]] for i in range(len(names))]
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        picked = rng.integers(0, len(names), len(names))
        idx = np.concatenate([members[i] for i in picked])
        by = y[idx]
        if by.min() == by.max():
            continue
        draws.append(auc(s[idx], by))
    return _percentile_interval(draws, level)


def split_queries(
    query_ids: Sequence[str], *, train_share: float = 0.5, seed: int = 0
) -> tuple[list[str], list[str]]:
    """Seeded random split of queries into (train, held-out), each in input order. Both parts
    are non-empty when there are at least two queries."""
    if not 0 < train_share < 1:
        raise ValueError(f"train_share must be in (0, 1), got {train_share}")
    ids = list(dict.fromkeys(query_ids))
    if len(ids) < 2:
        raise ValueError(f"a train/held-out split needs at least 2 queries, got {len(ids)}")
    n_train = min(len(ids) - 1, max(1, round(train_share * len(ids))))
    perm = np.random.default_rng(seed).permutation(len(ids))
    train_set = {ids[i] for i in perm[:n_train]}
    return [q for q in ids if q in train_set], [q for q in ids if q not in train_set]
