"""A calibrated relevance probability for L3 hits: ``p_relevant`` from a small fitted model.

Raw cosine separates relevant from irrelevant hits only weakly, and its scale means nothing
as a probability. The calibration jobs (``ctx eval calibrate`` / ``calibrate-beir``) fit a
:class:`RelevanceModel` on the same human labels as the cosine thresholds and store it as
``relevance_model.json`` next to ``thresholds.json``; the router then gives each L3 hit a
``p_relevant`` and labels hits by the model's own accept/skip cut points on it. Without the
file the cosine thresholds apply unchanged.

**Features** (:data:`FEATURES`, one row per hit, :func:`hit_features`): the dense cosine, the
sparse (BM25-style) score (0.0 when sparse search did not run), the 1-based rank in the
returned list, the margin to the next hit's cosine (0.0 for the last hit) and the query's
length in tokens (:func:`query_length`). Before fitting they are transformed to tame their
tails (``log1p`` of the sparse score and the query length, ``log`` of the rank) and
standardised. A feature absent from the labels (an old labels file has only the cosine) or
constant in them (no sparse search behind the labels) is left out; the provenance says which.

**Two kinds**, chosen by the fitting job on held-out queries (lower Brier score, then log
loss), the choice recorded in the file:

* ``"logistic"``: L2-regularised logistic regression on the standardised features, fitted by
  Newton's method. The cosine weight is constrained to be >= 0, so a closer hit never gets a
  lower probability with everything else fixed.
* ``"isotonic"``: a monotone step map of the cosine alone (pool-adjacent-violators), linear
  between the steps' ends: the cosine turned into a probability, nothing more.

Fitting and prediction are plain numpy (a few features, thousands of rows): the router pays
microseconds per route and the library needs no scikit-learn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from context_core.knowledge.sparse import SparseEncoder

if TYPE_CHECKING:
    from context_core.knowledge.store import Hit

__all__ = [
    "FEATURES",
    "KINDS",
    "RELEVANCE_FILE",
    "RelevanceKind",
    "RelevanceModel",
    "hit_features",
    "query_length",
    "query_length_counter",
    "relevance_path_for",
]

FEATURES: tuple[str, ...] = ("cosine", "sparse_score", "rank", "margin", "query_len")
RelevanceKind = Literal["logistic", "isotonic"]
KINDS: tuple[RelevanceKind, ...] = ("logistic", "isotonic")
RELEVANCE_FILE = "relevance_model.json"
FORMAT_VERSION = 1

# The transform each feature goes through before standardising (named in the file).
_TRANSFORMS: Mapping[str, str] = {
    "cosine": "identity",
    "sparse_score": "log1p",
    "rank": "log",
    "margin": "identity",
    "query_len": "log1p",
}


def query_length(text: str) -> int:
    """Tokens in a query, counted by the sparse encoder (:mod:`context_core.knowledge.sparse`: stop
    words dropped, Han unigrams and bigrams both count). The counter a model was fitted with
    is named in its provenance (:func:`query_length_counter`)."""
    return SparseEncoder.query_length(text)


def query_length_counter() -> str:
    """Which function :func:`query_length` uses (recorded with a fitted model)."""
    return "context_core.knowledge.sparse"


def hit_features(hits: Sequence[Hit], query_len: int) -> np.ndarray:
    """The feature matrix of a hit list, shape ``(len(hits), len(FEATURES))``, in list order.

    ``sparse_score`` is 0.0 when a hit has none (sparse search not run); ``rank`` is the hit's
    own rank when the search gave one, else its position + 1; ``margin`` is its cosine minus
    the next hit's (0.0 for the last).
    """
    n = len(hits)
    out = np.zeros((n, len(FEATURES)), dtype=float)
    if n == 0:
        return out
    cos = np.array([float(h.score) for h in hits], dtype=float)
    out[:, 0] = cos
    for i, h in enumerate(hits):
        sparse = getattr(h, "sparse_score", None)
        rank = getattr(h, "rank", None)
        out[i, 1] = float(sparse) if sparse is not None else 0.0
        out[i, 2] = float(rank) if rank is not None else float(i + 1)
    margin = cos[:-1] - cos[1:]
    out[:-1, 3] = np.where(np.isfinite(margin), margin, 0.0)  # a NaN neighbour: no margin
    out[:, 4] = float(query_len)
    return out


def relevance_path_for(thresholds_path: Path | str) -> Path:
    """Where the relevance model lives next to a thresholds file: ``thresholds.json`` ->
    ``relevance_model.json``, ``thresholds_<name>.json`` -> ``relevance_model_<name>.json``,
    any other ``<stem>.json`` -> ``<stem>.relevance_model.json``."""
    path = Path(thresholds_path)
    if path.name == "thresholds.json":
        return path.with_name(RELEVANCE_FILE)
    if path.name.startswith("thresholds_"):
        return path.with_name("relevance_model_" + path.name.removeprefix("thresholds_"))
    return path.with_name(f"{path.stem}.{RELEVANCE_FILE}")


def _transform(X: np.ndarray, features: Sequence[str]) -> np.ndarray:
    idx = [FEATURES.index(f) for f in features]
    Z = np.array(X[:, idx], dtype=float, copy=True)
    for j, name in enumerate(features):
        t = _TRANSFORMS[name]
        if t == "log1p":
            Z[:, j] = np.log1p(np.maximum(Z[:, j], 0.0))
        elif t == "log":
            Z[:, j] = np.log(np.maximum(Z[:, j], 1.0))
    return Z


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)), dtype=float)  # overflow-free


def _newton_logistic(
    Z: np.ndarray, y: np.ndarray, l2: float, free: np.ndarray, iters: int = 50
) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression (intercept unpenalised) on the ``free`` columns;
    the others keep weight 0."""
    n, d = Z.shape
    A = np.c_[np.ones(n), Z[:, free]]
    w = np.zeros(A.shape[1])
    pen = np.full(A.shape[1], l2)
    pen[0] = 0.0
    for _ in range(iters):
        p = _sigmoid(A @ w)
        grad = A.T @ (p - y) + pen * w
        hess = (A * (p * (1 - p))[:, None]).T @ A + np.diag(pen + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.max(np.abs(step))) < 1e-10:
            break
    coef = np.zeros(d)
    coef[free] = w[1:]
    return coef, float(w[0])


def _pav(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Increasing isotonic fit of ``y`` on ``x``: each block as its two ends (x_min, x_max)
    with the block's mean, ready for :func:`numpy.interp`."""
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order].astype(float)
    ux, start = np.unique(xs, return_index=True)
    counts = np.diff(np.r_[start, len(xs)])
    sums = np.add.reduceat(ys, start)
    # blocks: [value sum, weight, x_lo, x_hi]
    blocks: list[list[float]] = []
    for s, c, xv in zip(sums, counts, ux, strict=True):
        blocks.append([float(s), float(c), float(xv), float(xv)])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            s2, c2, _, hi = blocks.pop()
            blocks[-1][0] += s2
            blocks[-1][1] += c2
            blocks[-1][3] = hi
    px: list[float] = []
    py: list[float] = []
    for s, c, lo, hi in blocks:
        v = s / c
        px.append(lo)
        py.append(v)
        if hi > lo:
            px.append(hi)
            py.append(v)
    return np.array(px), np.array(py)


def _finite_tuple(values: Any, name: str) -> tuple[float, ...]:
    if not isinstance(values, list | tuple):
        raise ValueError(f'"{name}" must be a list of numbers')
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f'"{name}" must hold finite numbers, got {v!r}')
        out.append(float(v))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RelevanceModel:
    """A fitted map from hit features to ``p_relevant``, plus its cut points and provenance.

    ``features`` are the :data:`FEATURES` the model uses (a subset, in that order);
    :meth:`predict` always takes the full :func:`hit_features` matrix. ``accept``/``skip``
    are the thresholds on ``p_relevant`` (None until the fitting job sets them).
    """

    kind: RelevanceKind
    features: tuple[str, ...]
    mean: tuple[float, ...] = ()
    scale: tuple[float, ...] = ()
    coef: tuple[float, ...] = ()
    intercept: float = 0.0
    iso_x: tuple[float, ...] = ()
    iso_y: tuple[float, ...] = ()
    accept: float | None = None
    skip: float | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict)
    # precomputed for predict (the router calls it on every route)
    _cols: np.ndarray = field(init=False, repr=False, compare=False)
    _log1p: np.ndarray = field(init=False, repr=False, compare=False)
    _log: np.ndarray = field(init=False, repr=False, compare=False)
    _w: np.ndarray = field(init=False, repr=False, compare=False)
    _b: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = [_TRANSFORMS[f] for f in self.features]
        cols = np.array([FEATURES.index(f) for f in self.features], dtype=int)
        if self.kind == "logistic" and len(self.coef) == len(self.features):
            # (z - mean) / scale @ coef + b  ==  z @ (coef / scale) + (b - mean/scale @ coef)
            coef, mean, scale = (
                np.array(v, dtype=float) for v in (self.coef, self.mean, self.scale)
            )
            w = coef / scale
            b = float(self.intercept - float(mean @ w))
        else:
            w, b = np.zeros(len(self.features)), 0.0
        object.__setattr__(self, "_cols", cols)
        object.__setattr__(self, "_log1p", np.array([k == "log1p" for k in kinds], dtype=bool))
        object.__setattr__(self, "_log", np.array([k == "log" for k in kinds], dtype=bool))
        object.__setattr__(self, "_w", w)
        object.__setattr__(self, "_b", b)

    # --- fitting ------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        X: np.ndarray,
        y: np.ndarray | Sequence[int],
        kind: RelevanceKind = "logistic",
        *,
        features: Sequence[str] = FEATURES,
        l2: float = 1.0,
    ) -> RelevanceModel:
        """Fit on ``X`` (columns :data:`FEATURES`) and 0/1 labels ``y``.

        ``features`` restricts the model to the named columns (those present in the labels);
        a constant column is dropped and recorded in ``provenance["dropped_constant"]``. The
        isotonic kind uses the cosine only. Inputs are not modified.
        """
        X = np.asarray(X, dtype=float)
        yv = np.asarray(y, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(FEATURES) or X.shape[0] != yv.shape[0]:
            raise ValueError(
                f"X must be (n, {len(FEATURES)}) with one label per row; got {X.shape} and "
                f"{yv.shape}"
            )
        if not np.isin(yv, (0.0, 1.0)).all() or yv.min() == yv.max():
            raise ValueError("labels must be 0/1 and contain both classes")
        if not np.isfinite(X).all():
            raise ValueError("features must be finite numbers")
        unknown = [f for f in features if f not in FEATURES]
        if unknown or "cosine" not in features:
            raise ValueError(f"features must include 'cosine' and come from {FEATURES}")
        if kind == "isotonic":
            px, py = _pav(X[:, 0], yv)
            return cls(kind="isotonic", features=("cosine",), iso_x=tuple(px), iso_y=tuple(py))
        if kind != "logistic":
            raise ValueError(f"unknown relevance model kind {kind!r}; use one of {list(KINDS)}")
        used = [f for f in FEATURES if f in features]
        Z = _transform(X, used)
        std = Z.std(axis=0)
        constant = [f for f, s in zip(used, std, strict=True) if s < 1e-12 and f != "cosine"]
        used = [f for f in used if f not in constant]
        Z = _transform(X, used)
        mean, scale = Z.mean(axis=0), Z.std(axis=0)
        scale[scale < 1e-12] = 1.0
        Zs = (Z - mean) / scale
        free = np.ones(len(used), dtype=bool)
        coef, b = _newton_logistic(Zs, yv, l2, free)
        constraints: list[str] = []
        if coef[0] < 0:  # a closer hit must never look less relevant, all else equal
            free[0] = False
            coef, b = _newton_logistic(Zs, yv, l2, free)
            constraints.append("cosine weight fitted negative; fixed at 0")
        prov: dict[str, Any] = {"dropped_constant": constant}
        if constraints:
            prov["constraints"] = constraints
        return cls(
            kind="logistic",
            features=tuple(used),
            mean=tuple(float(v) for v in mean),
            scale=tuple(float(v) for v in scale),
            coef=tuple(float(v) for v in coef),
            intercept=b,
            provenance=prov,
        )

    # --- prediction ---------------------------------------------------------------------
    def predict(self, X: np.ndarray) -> np.ndarray:
        """``p_relevant`` per row of ``X`` (columns :data:`FEATURES`), each in [0, 1]."""
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(FEATURES):
            raise ValueError(f"X must have {len(FEATURES)} columns {FEATURES}, got {X.shape}")
        if X.shape[0] == 0:
            return np.zeros(0)
        if self.kind == "isotonic":
            return np.asarray(np.interp(X[:, 0], self.iso_x, self.iso_y), dtype=float)
        Z = X[:, self._cols]  # a copy (fancy indexing)
        if self._log1p.any():
            Z[:, self._log1p] = np.log1p(np.maximum(Z[:, self._log1p], 0.0))
        if self._log.any():
            Z[:, self._log] = np.log(np.maximum(Z[:, self._log], 1.0))
        return _sigmoid(Z @ self._w + self._b)

    def predict_hits(self, hits: Sequence[Hit], query_len: int) -> list[float]:
        """``p_relevant`` of each hit of a route's list (NaN cosine -> 0.0: never trusted)."""
        if not hits:
            return []
        X = hit_features(hits, query_len)
        bad = ~np.isfinite(X).all(axis=1)
        X[bad] = 0.0
        p = self.predict(X)
        p[bad] = 0.0
        return [float(v) for v in p]

    # --- thresholds and provenance ------------------------------------------------------
    def with_thresholds(self, accept: float, skip: float) -> RelevanceModel:
        if not (0.0 <= skip <= accept <= 1.0):
            raise ValueError(f"need 0 <= skip <= accept <= 1 on p_relevant, got {accept}/{skip}")
        return replace(self, accept=float(accept), skip=float(skip))

    def with_provenance(self, **values: Any) -> RelevanceModel:
        return replace(self, provenance={**self.provenance, **values})

    @property
    def model(self) -> str | None:
        """The embedding model the model was fitted for (``provenance["model"]``)."""
        value = self.provenance.get("model")
        return value.strip() if isinstance(value, str) and value.strip() else None

    # --- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``relevance_model.json`` document (``model`` at top level, as in thresholds)."""
        params: dict[str, Any]
        if self.kind == "isotonic":
            params = {"x": list(self.iso_x), "y": list(self.iso_y)}
        else:
            params = {
                "mean": list(self.mean),
                "scale": list(self.scale),
                "coef": list(self.coef),
                "intercept": self.intercept,
            }
        return {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "model": self.model,
            "features": list(self.features),
            "transforms": {f: _TRANSFORMS[f] for f in self.features},
            "params": params,
            "accept": self.accept,
            "skip": self.skip,
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, doc: Any) -> RelevanceModel:
        """Rebuild a model from :meth:`to_dict`'s document; ValueError names what is wrong."""
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f'"format" must be {FORMAT_VERSION}, got {doc.get("format")!r}')
        kind = doc.get("kind")
        if kind not in KINDS:
            raise ValueError(f'"kind" must be one of {list(KINDS)}, got {kind!r}')
        features = doc.get("features")
        if (
            not isinstance(features, list)
            or not features
            or features[0] != "cosine"
            or any(f not in FEATURES for f in features)
            or features != [f for f in FEATURES if f in features]
        ):
            raise ValueError(f'"features" must list names from {FEATURES} in that order')
        transforms = doc.get("transforms", {})
        if any(transforms.get(f, _TRANSFORMS[f]) != _TRANSFORMS[f] for f in features):
            raise ValueError(f'"transforms" differ from this version\'s {dict(_TRANSFORMS)}')
        params = doc.get("params")
        if not isinstance(params, dict):
            raise ValueError('"params" must be an object')
        prov = doc.get("provenance") or {}
        if not isinstance(prov, dict):
            raise ValueError('"provenance" must be an object')
        if isinstance(doc.get("model"), str):
            prov = {**prov, "model": doc["model"]}
        accept, skip = doc.get("accept"), doc.get("skip")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (accept, skip)):
            raise ValueError('"accept" and "skip" (thresholds on p_relevant) must be numbers')
        thresholds = _finite_tuple([accept, skip], "accept/skip")
        if kind == "isotonic":
            x, yv = _finite_tuple(params.get("x"), "x"), _finite_tuple(params.get("y"), "y")
            if not x or len(x) != len(yv) or any(b < a for a, b in pairwise(x)):
                raise ValueError('isotonic "x"/"y" must be equally long, non-empty, x sorted')
            model = cls(kind="isotonic", features=("cosine",), iso_x=x, iso_y=yv, provenance=prov)
        else:
            d = len(features)
            mean = _finite_tuple(params.get("mean"), "mean")
            scale = _finite_tuple(params.get("scale"), "scale")
            coef = _finite_tuple(params.get("coef"), "coef")
            (b,) = _finite_tuple([params.get("intercept")], "intercept")
            if not len(mean) == len(scale) == len(coef) == d or min(scale) <= 0:
                raise ValueError(f'"mean"/"scale"/"coef" need {d} values each, scale > 0')
            model = cls(
                kind="logistic",
                features=tuple(features),
                mean=mean,
                scale=scale,
                coef=coef,
                intercept=b,
                provenance=prov,
            )
        return model.with_thresholds(thresholds[0], thresholds[1])

    @classmethod
    def load(cls, path: Path | str) -> RelevanceModel:
        """Read ``relevance_model.json``; ValueError (or OSError) says why it cannot be used."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot be read as JSON ({e})") from e
        return cls.from_dict(doc)
