"""ROC calibration of the router's two L3 confidence thresholds.

The router labels every L3 hit by its cosine similarity ``s``:

* ``s >= accept``        -> ``confident`` (used as context),
* ``skip <= s < accept`` -> ``low_confidence`` (shown "for reference"),
* ``s < skip``           -> ``below_skip`` (if every hit is here, L3 is left out).

Both thresholds are learnt from labelled hits (see :mod:`evaluation.labels`).

Accept criteria (``accept_criterion``):

* ``"youden"`` (default): the ROC threshold with the highest Youden J = TPR - FPR, i.e. the
  point that best separates relevant from irrelevant hits when both errors cost the same. Ties
  go to the highest threshold (fewer false positives for the same J).
* ``"precision"``: the lowest threshold whose precision (share of relevant hits among hits
  scoring at or above it) reaches ``target_precision`` (default 0.9): admit as much as possible
  while keeping the admitted context mostly right.

Skip criteria (``skip_criterion``):

* ``"recall"`` (default): the highest threshold that still keeps at least ``target_recall``
  (default 0.95) of the relevant hits at or above it: below it there is almost nothing worth
  showing, so dropping L3 loses at most 5 % of relevant hits.

Ordering guarantee: ``skip <= accept`` always holds in a result. If the skip criterion lands
above the accept threshold, skip is lowered to accept (``adjustments`` says so). Lowering a
threshold can only raise recall, so the skip criterion's recall target still holds; the
low-confidence band is then empty, which the report shows.

Uncertainty: percentile bootstrap (resampling hits with replacement, ``n_boot`` times, seeded)
for both thresholds and the AUC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from context_core.errors import CalibrationError
from context_core.fsutil import atomic_write_text
from context_core.routing.confidence import DEFAULT_ACCEPT, DEFAULT_SKIP, label_score, model_name

if TYPE_CHECKING:
    from evaluation.labels import LabelSet

__all__ = [
    "ACCEPT_CRITERIA",
    "SKIP_CRITERIA",
    "CalibrationResult",
    "Interval",
    "LabelChange",
    "Provenance",
    "calibrate",
    "compare_with_current",
    "write_thresholds",
]


def _as_arrays(scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray):
    s = np.array(scores, dtype=float, copy=True)
    y = np.array(labels, dtype=int, copy=True)
    if s.ndim != 1 or s.shape != y.shape:
        raise CalibrationError(
            f"scores and labels must be 1-D and equally long (got {s.shape} and {y.shape})"
        )
    if not np.isin(y, (0, 1)).all():
        raise CalibrationError("labels must be 0 or 1")
    if not np.isfinite(s).all():
        raise CalibrationError("scores must be finite numbers")
    return s, y


# --- criteria: (scores, labels, target) -> threshold ------------------------------------


def _accept_youden(s: np.ndarray, y: np.ndarray, _target: float) -> float:
    from sklearn.metrics import roc_curve

    fpr, tpr, thr = roc_curve(y, s, drop_intermediate=False)
    finite = np.isfinite(thr)  # the first threshold is +inf (nothing admitted)
    j = (tpr - fpr)[finite]
    thr = thr[finite]
    best = j.max()
    return float(thr[np.isclose(j, best, rtol=0, atol=1e-12)].max())


def _accept_precision(s: np.ndarray, y: np.ndarray, target: float) -> float:
    order = np.argsort(-s, kind="stable")
    s_sorted, y_sorted = s[order], y[order]
    # Precision when admitting every hit with score >= t, for each distinct t (last index of a run).
    tp = np.cumsum(y_sorted)
    n_admitted = np.arange(1, len(s_sorted) + 1)
    last_of_value = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    precision = (tp / n_admitted)[last_of_value]
    thresholds = s_sorted[last_of_value]
    ok = precision >= target - 1e-12
    if not ok.any():
        raise CalibrationError(
            f"accept criterion 'precision': no threshold reaches precision {target:.3f} "
            f"(best is {precision.max():.3f}); lower target_precision or use 'youden'"
        )
    return float(thresholds[ok].min())


def _skip_recall(s: np.ndarray, y: np.ndarray, target: float) -> float:
    pos = np.sort(s[y == 1])[::-1]
    keep = max(1, math.ceil(target * len(pos) - 1e-9))
    return float(pos[keep - 1])


ACCEPT_CRITERIA: Mapping[str, Callable[[np.ndarray, np.ndarray, float], float]] = {
    "youden": _accept_youden,
    "precision": _accept_precision,
}
SKIP_CRITERIA: Mapping[str, Callable[[np.ndarray, np.ndarray, float], float]] = {
    "recall": _skip_recall,
}


def _criterion(table: Mapping[str, Any], name: str, kind: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise CalibrationError(
            f"unknown {kind} criterion {name!r}; choose one of {', '.join(sorted(table))}"
        ) from None


# --- result types --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """A percentile-bootstrap confidence interval."""

    low: float
    high: float
    level: float


@dataclass(frozen=True, eq=False)
class CalibrationResult:
    """Thresholds, their uncertainty, and the curves they came from (arrays are read-only)."""

    accept: float
    skip: float
    auc: float
    n: int
    n_pos: int
    n_neg: int
    accept_criterion: str
    skip_criterion: str
    target_precision: float
    target_recall: float
    ci: Mapping[str, Interval]
    n_boot: int
    seed: int
    adjustments: tuple[str, ...]
    scores: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    fpr: np.ndarray = field(repr=False)
    tpr: np.ndarray = field(repr=False)
    roc_thresholds: np.ndarray = field(repr=False)

    def precision_recall_at(self, threshold: float) -> tuple[float, float]:
        """Precision and recall of admitting every hit scoring at or above ``threshold``."""
        admitted = self.scores >= threshold
        tp = int((admitted & (self.labels == 1)).sum())
        precision = tp / int(admitted.sum()) if admitted.any() else float("nan")
        return precision, tp / self.n_pos

    def criteria_dict(self) -> dict[str, Any]:
        return {
            "accept": self.accept_criterion,
            "skip": self.skip_criterion,
            "target_precision": self.target_precision,
            "target_recall": self.target_recall,
            "n_boot": self.n_boot,
            "seed": self.seed,
            "adjustments": list(self.adjustments),
        }

    def summary(self) -> dict[str, Any]:
        """The JSON-ready figures (no arrays)."""
        return {
            "accept": self.accept,
            "skip": self.skip,
            "auc": self.auc,
            "n": self.n,
            "n_pos": self.n_pos,
            "n_neg": self.n_neg,
            "ci": {k: _interval_json(v) for k, v in self.ci.items()},
            "criteria": self.criteria_dict(),
        }


def _interval_json(v: Interval) -> dict[str, float | None]:
    def num(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {"low": num(v.low), "high": num(v.high), "level": v.level}


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def _thresholds(
    s: np.ndarray,
    y: np.ndarray,
    accept_fn: Callable[..., float],
    skip_fn: Callable[..., float],
    target_precision: float,
    target_recall: float,
) -> tuple[float, float, bool]:
    accept = accept_fn(s, y, target_precision)
    skip = skip_fn(s, y, target_recall)
    if skip > accept:
        return accept, accept, True
    return accept, skip, False


def calibrate(
    scores: Sequence[float] | np.ndarray,
    labels: Sequence[int] | np.ndarray,
    *,
    accept_criterion: str = "youden",
    skip_criterion: str = "recall",
    target_precision: float = 0.9,
    target_recall: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
) -> CalibrationResult:
    """Learn accept/skip thresholds from similarity ``scores`` and 0/1 relevance ``labels``.

    Criteria are described in the module docstring; unknown names raise
    :class:`CalibrationError`. Inputs are copied, never modified. ``n_boot=0`` skips the
    bootstrap (intervals are then NaN).
    """
    from sklearn.metrics import roc_auc_score, roc_curve

    accept_fn = _criterion(ACCEPT_CRITERIA, accept_criterion, "accept")
    skip_fn = _criterion(SKIP_CRITERIA, skip_criterion, "skip")
    if not 0 < target_precision <= 1 or not 0 < target_recall <= 1:
        raise CalibrationError("target_precision and target_recall must be in (0, 1]")
    if n_boot < 0:
        raise CalibrationError("n_boot must be >= 0")
    s, y = _as_arrays(scores, labels)
    n_pos, n_neg = int((y == 1).sum()), int((y == 0).sum())
    if n_pos == 0 or n_neg == 0:
        raise CalibrationError(
            f"calibration needs both relevant and irrelevant hits (got {n_pos} relevant, "
            f"{n_neg} irrelevant)"
        )

    accept, skip, clipped = _thresholds(s, y, accept_fn, skip_fn, target_precision, target_recall)
    adjustments: list[str] = []
    if clipped:
        raw_skip = skip_fn(s, y, target_recall)
        adjustments.append(
            f"skip criterion gave {raw_skip:.4f} > accept {accept:.4f}; skip lowered to accept "
            "(recall target still met, low-confidence band empty)"
        )
    auc = float(roc_auc_score(y, s))
    fpr, tpr, thr = roc_curve(y, s)

    ci = _bootstrap(
        s, y, accept_fn, skip_fn, target_precision, target_recall, n_boot, seed, ci_level
    )
    return CalibrationResult(
        accept=accept,
        skip=skip,
        auc=auc,
        n=len(s),
        n_pos=n_pos,
        n_neg=n_neg,
        accept_criterion=accept_criterion,
        skip_criterion=skip_criterion,
        target_precision=target_precision,
        target_recall=target_recall,
        ci=ci,
        n_boot=n_boot,
        seed=seed,
        adjustments=tuple(adjustments),
        scores=_readonly(s),
        labels=_readonly(y),
        fpr=_readonly(fpr),
        tpr=_readonly(tpr),
        roc_thresholds=_readonly(thr),
    )


def _bootstrap(
    s: np.ndarray,
    y: np.ndarray,
    accept_fn: Callable[..., float],
    skip_fn: Callable[..., float],
    target_precision: float,
    target_recall: float,
    n_boot: int,
    seed: int,
    level: float,
) -> dict[str, Interval]:
    from sklearn.metrics import roc_auc_score

    nan = Interval(float("nan"), float("nan"), level)
    if n_boot == 0:
        return {"accept": nan, "skip": nan, "auc": nan}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {"accept": [], "skip": [], "auc": []}
    for _ in range(n_boot):
        idx = rng.integers(0, len(s), len(s))
        bs, by = s[idx], y[idx]
        if by.min() == by.max():  # a one-class resample has no ROC
            continue
        draws["auc"].append(float(roc_auc_score(by, bs)))
        try:
            a, k, _ = _thresholds(bs, by, accept_fn, skip_fn, target_precision, target_recall)
        except CalibrationError:  # e.g. target precision unreachable in this resample
            continue
        draws["accept"].append(a)
        draws["skip"].append(k)
    tail = (1 - level) / 2 * 100
    out: dict[str, Interval] = {}
    for key, values in draws.items():
        if values:
            lo, hi = np.percentile(values, [tail, 100 - tail])
            out[key] = Interval(float(lo), float(hi), level)
        else:
            out[key] = nan
    return out


# --- thresholds.json ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a set of thresholds came from; stored next to them so they can be audited."""

    model: str
    collection: str
    labels_sha256: str
    labels_path: str
    date: str = ""
    tool_version: str = ""

    def filled(self) -> Provenance:
        """A copy with ``date``/``tool_version`` defaulted to now / the installed package."""
        date = self.date or datetime.now(UTC).isoformat(timespec="seconds")
        version = self.tool_version or _tool_version()
        return Provenance(
            self.model, self.collection, self.labels_sha256, self.labels_path, date, version
        )


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("context-platform")
    except PackageNotFoundError:
        return "0+unknown"


def thresholds_document(result: CalibrationResult, provenance: Provenance) -> dict[str, Any]:
    """The thresholds.json content. ``accept``/``skip``/``model`` at top level are the runtime
    contract: the router uses the pair only with the embedding model named here
    (:class:`context_core.routing.confidence.PolicySource`), so ``model`` is recorded the way a
    collection records it (:func:`context_core.routing.confidence.model_name`)."""
    doc = result.summary()
    filled = provenance.filled()
    doc["model"] = model_name(filled.model) if filled.model else None
    doc["provenance"] = asdict(filled)
    return doc


def write_thresholds(result: CalibrationResult, path: Path | str, provenance: Provenance) -> Path:
    """Write thresholds.json atomically (tmp file + rename), so the router never reads half."""
    doc = thresholds_document(result, provenance)
    return atomic_write_text(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


# --- comparison with the thresholds in force -------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelChange:
    """How many labelled hits would change label if the new thresholds replaced the current."""

    current_accept: float
    current_skip: float
    new_accept: float
    new_skip: float
    changed_share: float
    changed_share_relevant: float
    changed_share_irrelevant: float
    transitions: Mapping[str, int]  # "confident->low_confidence" -> count (changes only)


def compare_with_current(
    result: CalibrationResult,
    labels: LabelSet | None = None,
    current_accept: float = DEFAULT_ACCEPT,
    current_skip: float = DEFAULT_SKIP,
) -> LabelChange:
    """Share of hits whose label would change, overall and per class (relevant / irrelevant).

    ``labels`` defaults to the hits ``result`` was calibrated on; pass another
    :class:`~evaluation.labels.LabelSet` (e.g. a held-out file) to compare on it instead.
    """
    if labels is None:
        s, y = result.scores, result.labels
    else:
        s, y = _as_arrays(labels.scores, labels.labels)
    old = np.array([label_score(v, current_accept, current_skip) for v in s])
    new = np.array([label_score(v, result.accept, result.skip) for v in s])
    changed = old != new

    def share(mask: np.ndarray) -> float:
        return float(changed[mask].mean()) if mask.any() else float("nan")

    transitions: dict[str, int] = {}
    for a, b in zip(old[changed], new[changed], strict=True):
        key = f"{a}->{b}"
        transitions[key] = transitions.get(key, 0) + 1
    return LabelChange(
        current_accept=current_accept,
        current_skip=current_skip,
        new_accept=result.accept,
        new_skip=result.skip,
        changed_share=float(changed.mean()) if len(s) else float("nan"),
        changed_share_relevant=share(y == 1),
        changed_share_irrelevant=share(y == 0),
        transitions=dict(sorted(transitions.items())),
    )
