"""Fitting the relevance model (``p_relevant``) from the same labels as the cosine thresholds.

Steps, each pure until the last:

1. :func:`features_from_frame`: the labels frame -> the
   :data:`~context_core.routing.relevance.FEATURES`
   matrix and the features the file actually has (an old file has only ``similarity``; a
   column with a gap counts as absent).
2. :func:`fit_relevance`: out-of-fold predictions of each candidate (:data:`CANDIDATES`:
   ``logistic`` over the present features, ``logistic_cosine`` and ``isotonic`` over the
   cosine alone) with folds **by query**, so no query's hits are both fitted and judged; the
   candidate with the lowest held-out Brier score wins (log loss breaks a tie). Its
   out-of-fold probabilities go through :func:`evaluation.calibration.calibrate`, the same
   operating-point criteria as the cosine thresholds, to give accept/skip on ``p_relevant``;
   the final model is that candidate refitted on every row.
3. :func:`write_relevance_model`: ``relevance_model.json`` written atomically.

The two cosine-only candidates are also the "cosine as a probability" baseline the report
compares with (the better of the two on held-out Brier), so any gain of the full logistic
model comes from the other features, not from re-scaling the cosine.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from context_core.errors import CalibrationError
from context_core.fsutil import atomic_write_text
from context_core.routing.relevance import (
    FEATURES,
    RelevanceKind,
    RelevanceModel,
    query_length_counter,
)

if TYPE_CHECKING:
    import pandas as pd

    from evaluation.calibration import CalibrationResult
    from evaluation.labels import LabelSet

log = logging.getLogger(__name__)

__all__ = [
    "CANDIDATES",
    "FEATURE_COLUMNS",
    "RelevanceFit",
    "auc_score",
    "brier_score",
    "features_from_frame",
    "fit_relevance",
    "log_loss",
    "query_folds",
    "reliability_bins",
    "try_fit_relevance",
    "write_relevance_model",
]

# labels-file column of each feature
FEATURE_COLUMNS: Mapping[str, str] = {
    "cosine": "similarity",
    "sparse_score": "sparse_score",
    "rank": "rank",
    "margin": "margin",
    "query_len": "query_len",
}
_DEFAULTS = {"sparse_score": 0.0, "rank": 1.0, "margin": 0.0, "query_len": 0.0}


# --- metrics (numpy; probabilities in [0, 1], labels 0/1) -------------------------------------


def brier_score(p: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((np.asarray(p, float) - np.asarray(y, float)) ** 2))


def log_loss(p: np.ndarray, y: np.ndarray, eps: float = 1e-6) -> float:
    q = np.clip(np.asarray(p, float), eps, 1 - eps)
    yv = np.asarray(y, float)
    return float(-np.mean(yv * np.log(q) + (1 - yv) * np.log(1 - q)))


def auc_score(s: np.ndarray, y: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic (ties count one half)."""
    from scipy.stats import rankdata

    s, yv = np.asarray(s, float), np.asarray(y, int)
    n_pos, n_neg = int((yv == 1).sum()), int((yv == 0).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[yv == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def reliability_bins(p: np.ndarray, y: np.ndarray, *, n_bins: int = 10) -> list[dict[str, Any]]:
    """Equal-width bins of predicted probability: per bin the count, mean prediction and
    observed share of relevant hits (the points of a reliability diagram). Empty bins are
    left out."""
    p, yv = np.asarray(p, float), np.asarray(y, float)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1], right=False), 0, n_bins - 1)
    out = []
    for b in range(n_bins):
        m = idx == b
        if m.any():
            out.append(
                {
                    "low": float(edges[b]),
                    "high": float(edges[b + 1]),
                    "n": int(m.sum()),
                    "mean_p": float(p[m].mean()),
                    "observed": float(yv[m].mean()),
                }
            )
    return out


# --- features and folds -----------------------------------------------------------------------


def features_from_frame(frame: pd.DataFrame) -> tuple[np.ndarray, tuple[str, ...]]:
    """``(X, present)``: ``X`` has every :data:`FEATURES` column (absent ones at a neutral
    default), ``present`` names the ones the frame really holds, complete and numeric."""
    import pandas as pd

    n = len(frame)
    X = np.zeros((n, len(FEATURES)), dtype=float)
    present: list[str] = []
    for j, name in enumerate(FEATURES):
        col = FEATURE_COLUMNS[name]
        values = pd.to_numeric(frame[col], errors="coerce") if col in frame.columns else None
        if values is not None and values.notna().all():
            X[:, j] = values.to_numpy(dtype=float)
            present.append(name)
        else:
            X[:, j] = _DEFAULTS.get(name, 0.0)
    if "cosine" not in present:
        raise CalibrationError("the labels have no complete numeric 'similarity' column")
    return X, tuple(present)


def query_folds(groups: Sequence[Any] | np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold index per row, whole queries per fold (rows when there are fewer than 2 queries)."""
    g = np.asarray([str(v) for v in groups])
    rng = np.random.default_rng(seed)
    unique = np.unique(g)
    if len(unique) >= 2:
        k = max(2, min(k, len(unique)))
        order = rng.permutation(len(unique))
        fold_of = {unique[i]: n % k for n, i in enumerate(order)}
        return np.array([fold_of[v] for v in g], dtype=int)
    k = max(2, min(k, len(g)))
    return np.asarray(rng.permutation(len(g)) % k, dtype=int)


def _oof(
    X: np.ndarray,
    y: np.ndarray,
    folds: np.ndarray,
    kind: RelevanceKind,
    features: Sequence[str],
    l2: float,
) -> np.ndarray:
    p = np.zeros(len(y))
    for f in np.unique(folds):
        test = folds == f
        train = ~test
        yt = y[train]
        if yt.min() == yt.max():  # one class in the training folds: its base rate
            p[test] = float(yt.mean())
            continue
        model = RelevanceModel.fit(X[train], yt, kind, features=features, l2=l2)
        p[test] = model.predict(X[test])
    return p


# --- the fit --------------------------------------------------------------------------------


# candidate name -> (kind, cosine only?)
CANDIDATES: Mapping[str, tuple[RelevanceKind, bool]] = {
    "logistic": ("logistic", False),
    "logistic_cosine": ("logistic", True),
    "isotonic": ("isotonic", True),
}
COSINE_ONLY = ("logistic_cosine", "isotonic")  # the "cosine as a probability" baselines


@dataclass(frozen=True, eq=False)
class RelevanceFit:
    """The chosen model (with its cut points and provenance) and the held-out evidence.

    ``selection`` holds each candidate's held-out metrics: ``logistic`` (every present
    feature), ``logistic_cosine`` (Platt scaling of the cosine) and ``isotonic`` (the cosine's
    monotone step map); the last two are the cosine-as-probability baselines."""

    model: RelevanceModel
    chosen: str
    selection: Mapping[str, Mapping[str, float]]  # candidate -> {brier, log_loss, auc}
    oof: Mapping[str, np.ndarray] = field(repr=False)  # candidate -> held-out p per row
    labels: np.ndarray = field(repr=False)
    cosine: np.ndarray = field(repr=False)
    thresholds: CalibrationResult = field(repr=False)
    present: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    n_folds: int = 0

    @property
    def kind(self) -> RelevanceKind:
        return self.model.kind

    @property
    def p(self) -> np.ndarray:
        """Held-out ``p_relevant`` of the chosen candidate."""
        return self.oof[self.chosen]

    @property
    def cosine_baseline(self) -> str:
        """The better-calibrated cosine-only candidate (lower held-out Brier)."""
        return min(COSINE_ONLY, key=lambda c: self.selection[c]["brier"])

    def summary(self) -> dict[str, Any]:
        t = self.thresholds
        base = self.cosine_baseline
        return {
            "kind": self.kind,
            "chosen": self.chosen,
            "features": list(self.model.features),
            "features_missing": list(self.missing),
            "folds": self.n_folds,
            "selection": {k: dict(v) for k, v in self.selection.items()},
            "held_out": {
                "brier_p_relevant": self.selection[self.chosen]["brier"],
                "brier_cosine": self.selection[base]["brier"],
                "cosine_baseline": base,
                "brier_cosine_isotonic": self.selection["isotonic"]["brier"],
                "brier_cosine_platt": self.selection["logistic_cosine"]["brier"],
                "auc_p_relevant": self.selection[self.chosen]["auc"],
                "auc_cosine": auc_score(self.cosine, self.labels),
            },
            "accept": t.accept,
            "skip": t.skip,
            "thresholds": t.summary(),
            "reliability": {
                "p_relevant": reliability_bins(self.p, self.labels),
                "cosine": reliability_bins(self.oof[base], self.labels),
            },
        }


def fit_relevance(
    labels: LabelSet,
    *,
    model: str,
    dataset: str,
    retrieval_mode: str | None = None,
    folds: int = 5,
    seed: int = 0,
    l2: float = 1.0,
    candidates: Sequence[str] = tuple(CANDIDATES),
    kinds: Sequence[RelevanceKind] | None = None,
    **calib_kwargs: Any,
) -> RelevanceFit:
    """Fit ``p_relevant`` on a validated label set (see the module docstring).

    ``calib_kwargs`` are :func:`evaluation.calibration.calibrate`'s (criteria, targets,
    n_boot, seed), applied to the held-out probabilities. Raises :class:`CalibrationError`
    when the labels cannot support a model (e.g. a precision target no threshold reaches).
    ``kinds`` (e.g. ``("logistic",)``) keeps only the candidates of those model kinds.
    """
    from context_core.routing.confidence import model_name
    from evaluation.calibration import _tool_version, calibrate

    if kinds is not None:
        candidates = [c for c in candidates if c in CANDIDATES and CANDIDATES[c][0] in kinds]
    unknown = [c for c in candidates if c not in CANDIDATES]
    if unknown or not candidates:
        raise CalibrationError(f"unknown relevance candidates {unknown}; use {list(CANDIDATES)}")
    frame = labels.frame
    X, present = features_from_frame(frame)
    y = labels.labels.astype(int)
    if y.min() == y.max():
        raise CalibrationError("the relevance model needs both relevant and irrelevant hits")
    fold = query_folds(frame["query_id"].to_numpy(), folds, seed)
    oof: dict[str, np.ndarray] = {}
    selection: dict[str, dict[str, float]] = {}
    for name, (kind, cosine_only) in CANDIDATES.items():  # baselines always, for the report
        feats = ("cosine",) if cosine_only else present
        p = _oof(X, y, fold, kind, feats, l2)
        oof[name] = p
        selection[name] = {
            "brier": brier_score(p, y),
            "log_loss": log_loss(p, y),
            "auc": auc_score(p, y),
        }
    # the full logistic is the cosine-only one when the labels hold nothing else
    pool = [c for c in candidates if not (c == "logistic" and present == ("cosine",))] or list(
        candidates
    )
    chosen = min(pool, key=lambda c: (round(selection[c]["brier"], 6), selection[c]["log_loss"]))
    kind, cosine_only = CANDIDATES[chosen]
    thresholds = calibrate(oof[chosen], y, **calib_kwargs)
    final = RelevanceModel.fit(X, y, kind, features=("cosine",) if cosine_only else present, l2=l2)
    missing = tuple(f for f in FEATURES if f not in present)
    mode = retrieval_mode or ("hybrid" if "sparse_score" in present else "dense")
    base = min(COSINE_ONLY, key=lambda c: selection[c]["brier"])
    prov = {
        "model": model_name(model) if model else None,
        "dataset": dataset,
        "labels_sha256": labels.sha256,
        "labels_path": str(labels.path) if labels.path else "",
        "n": len(y),
        "positives": int(y.sum()),
        "retrieval_mode": mode,
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "tool_version": _tool_version(),
        "candidate": chosen,
        "brier": selection[chosen]["brier"],
        "log_loss": selection[chosen]["log_loss"],
        "auc": selection[chosen]["auc"],
        "brier_cosine": selection[base]["brier"],
        "cosine_baseline": base,
        "auc_cosine": auc_score(X[:, 0], y),
        "metrics_on": f"out-of-fold, {int(fold.max()) + 1} folds by query",
        "selection": selection,
        "chosen_by": "lowest held-out Brier score, then log loss",
        "features": list(final.features),
        "features_missing": list(missing),
        "query_len_counter": query_length_counter(),
        "criteria": thresholds.criteria_dict(),
    }
    if missing:
        prov["note"] = (
            f"the labels hold no {', '.join(missing)} column(s): the model uses "
            f"{', '.join(present)} only"
        )
    model_doc = final.with_provenance(**prov).with_thresholds(thresholds.accept, thresholds.skip)
    return RelevanceFit(
        model=model_doc,
        chosen=chosen,
        selection=selection,
        oof=oof,
        labels=y,
        cosine=X[:, 0].copy(),
        thresholds=thresholds,
        present=present,
        missing=missing,
        n_folds=int(fold.max()) + 1,
    )


def write_relevance_model(model: RelevanceModel, path: Path | str) -> Path:
    """Write ``relevance_model.json`` atomically (the router never reads half a file)."""
    doc = _finite(model.to_dict())
    return atomic_write_text(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, np.generic):
        return _finite(value.item())
    return value


def try_fit_relevance(
    labels: LabelSet,
    *,
    model: str,
    dataset: str,
    enabled: bool = True,
    calib_kwargs: Mapping[str, Any] | None = None,
    retrieval_mode: str | None = None,
) -> tuple[RelevanceFit | None, str]:
    """:func:`fit_relevance` for the calibration jobs: ``(fit, "")``, or ``(None, why)`` when
    it is switched off or the labels cannot support it. The cosine thresholds never depend
    on it, so a failure here is a note in the report, not a failed job."""
    if not enabled:
        return None, "Not fitted this run (--no-relevance); an existing model file is untouched."
    try:
        fit = fit_relevance(
            labels,
            model=model,
            dataset=dataset,
            retrieval_mode=retrieval_mode,
            **dict(calib_kwargs or {}),
        )
        return fit, ""
    except (CalibrationError, ValueError) as e:
        log.warning("relevance model not fitted: %s", e)
        return None, f"Not fitted: {e}. An existing model file is untouched."
