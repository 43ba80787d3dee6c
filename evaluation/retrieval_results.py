"""The dense / sparse / hybrid comparison's results: the value types a run returns.

:mod:`.retrieval_compare` computes them and :mod:`.retrieval_report` writes them out; both
import them from here, so neither imports the other for them (:mod:`.retrieval_compare`
re-exports the public ones).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.calibration import Interval

__all__ = [
    "FULL_LOGISTIC",
    "HEADLINE_MODE",
    "ComparisonRun",
    "ConfidenceResult",
    "Goal",
    "ModeResult",
    "OperatingPoint",
    "interval_json",
]

HEADLINE_MODE = "hybrid"  # the router's default mode: the confidence goal is read on it
# shown next to p_relevant when the fitting job chose a cosine-only map
FULL_LOGISTIC = "logistic, all features"


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeResult:
    """One retrieval mode over all queries: per-query metric values, means and intervals."""

    mode: str
    k: int
    query_ids: tuple[str, ...]
    per_query: Mapping[str, np.ndarray] = field(repr=False)  # "ndcg"|"recall"|"mrr" -> values
    mean: Mapping[str, float]
    ci: Mapping[str, Interval]
    latency_ms: Mapping[str, float]  # p50, p99, mean, n

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "k": self.k,
            "n_queries": len(self.query_ids),
            "mean": dict(self.mean),
            "ci": {m: interval_json(v) for m, v in self.ci.items()},
            "latency_ms": dict(self.latency_ms),
        }


@dataclass(frozen=True)
class OperatingPoint:
    """Admitting every held-out hit whose signal is at or above ``threshold`` (``confident``)."""

    signal: str
    threshold: float
    precision: float
    precision_ci: Interval
    recall: float
    false_positive_rate: float
    admitted_share: float
    n_admitted: int


@dataclass(frozen=True)
class ConfidenceResult:
    """Cosine vs ``p_relevant`` on the held-out queries' top-k hits of one mode."""

    mode: str
    n_train_queries: int
    n_test_queries: int
    n_train_hits: int
    n_test_hits: int
    n_test_relevant: int
    auc: Mapping[str, float]  # "cosine" / "p_relevant"
    auc_ci: Mapping[str, Interval]
    brier: float | None
    operating: Mapping[str, OperatingPoint]
    precision_at_cosine_recall: float | None  # p_relevant's precision at cosine's recall
    model_kind: str | None
    skipped: str | None
    roc: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(repr=False)
    reliability: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "queries": {"train": self.n_train_queries, "held_out": self.n_test_queries},
            "hits": {
                "train": self.n_train_hits,
                "held_out": self.n_test_hits,
                "held_out_relevant": self.n_test_relevant,
            },
            "auc": dict(self.auc),
            "auc_ci": {s: interval_json(v) for s, v in self.auc_ci.items()},
            "brier_p_relevant": self.brier,
            "operating_points": {
                s: {**dataclasses.asdict(o), "precision_ci": interval_json(o.precision_ci)}
                for s, o in self.operating.items()
            },
            "p_relevant_precision_at_cosine_recall": self.precision_at_cosine_recall,
            "relevance_model": self.model_kind,
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    measured: float
    ci: Interval | None
    passed: bool | None  # None: not measurable in this run
    note: str = ""

    @property
    def verdict(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass(frozen=True)
class ComparisonRun:
    dataset: str
    model: str
    k: int
    n_docs: int
    n_chunks: int
    n_queries: int
    seed: int
    n_boot: int
    train_share: float
    modes: Mapping[str, ModeResult]
    skipped_modes: Mapping[str, str]
    confidence: Mapping[str, ConfidenceResult]
    goals: tuple[Goal, ...]
    settings_used: Mapping[str, Any]
    timings_s: Mapping[str, float]
    date: str
    report: Mapping[str, Path] = field(default_factory=dict)

    def with_report(self, paths: Mapping[str, Path]) -> ComparisonRun:
        return dataclasses.replace(self, report=dict(paths))


def interval_json(v: Interval) -> dict[str, float | None]:
    def num(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {"low": num(v.low), "high": num(v.high), "level": v.level}
