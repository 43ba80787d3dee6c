"""Calibrated confidence thresholds for L3 hits.

An L3 hit is only as useful as our belief that it answers the step. The calibration job
(``ctx eval calibrate``) fits two cut points on labelled retrieval results and writes them to
``reports/thresholds.json``; this module reads that file and labels every hit:

* ``score >= accept``          -> ``"confident"``: used as context;
* ``skip <= score < accept``   -> ``"low_confidence"``: passed on, marked "for reference";
* ``score < skip``             -> ``"below_skip"``: dropped.

Scores are **cosine similarities** (higher = closer, identical text ~ 1.0), the convention of
:class:`context_core.knowledge.store.Hit`. A distance (lower = closer) fed in by mistake would
invert every label, so :meth:`ConfidencePolicy.label` refuses values outside [-1, 1] and the
tests pin that a search for a stored text itself comes back ``confident``.

A missing thresholds file is normal (before the first calibration): the settings' defaults
(``CTX_ACCEPT_THRESHOLD`` 0.72, ``CTX_SKIP_THRESHOLD`` 0.65) apply silently. A *malformed* file
is an operator problem: the defaults apply and a warning names the file and what is wrong.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from context_core.config import Settings

__all__ = ["DEFAULT_ACCEPT", "DEFAULT_SKIP", "ConfidenceLabel", "ConfidencePolicy"]

log = logging.getLogger(__name__)

DEFAULT_ACCEPT = 0.72
DEFAULT_SKIP = 0.65

ConfidenceLabel = Literal["confident", "low_confidence", "below_skip"]

# Float noise of a normalised dot product can land a hair outside [-1, 1]; a distance
# metric (euclidean, 1 - cos) easily goes far beyond. This tolerance separates the two.
_COSINE_SLACK = 1e-3


@dataclass(frozen=True, slots=True)
class ConfidencePolicy:
    """Two cut points on cosine similarity, and where they came from.

    ``source`` is a human-readable provenance string (a file path, or which defaults), shown
    in health reports so nobody wonders which thresholds a run used.
    """

    accept: float = DEFAULT_ACCEPT
    skip: float = DEFAULT_SKIP
    source: str = "built-in defaults"

    def __post_init__(self) -> None:
        problem = _check_pair(self.accept, self.skip)
        if problem:
            raise ValueError(f"invalid confidence thresholds: {problem}")

    @classmethod
    def defaults(cls, settings: Settings | None = None) -> ConfidencePolicy:
        """The configured defaults (``CTX_ACCEPT_THRESHOLD`` / ``CTX_SKIP_THRESHOLD``)."""
        if settings is None:
            return cls()
        return cls(
            accept=settings.accept_threshold,
            skip=settings.skip_threshold,
            source="settings (CTX_ACCEPT_THRESHOLD / CTX_SKIP_THRESHOLD)",
        )

    @classmethod
    def load(cls, settings: Settings) -> ConfidencePolicy:
        """Thresholds from ``settings.resolved_thresholds_path`` if valid, else the defaults."""
        return cls.from_file(settings.resolved_thresholds_path, fallback=cls.defaults(settings))

    @classmethod
    def from_file(cls, path: Path, *, fallback: ConfidencePolicy | None = None) -> ConfidencePolicy:
        """Read a thresholds file; on any problem log a warning and return ``fallback``."""
        fallback = fallback or cls()
        if not path.exists():
            log.debug("no thresholds file at %s; using %s", path, fallback.source)
            return fallback
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return _fallback(fallback, path, f"cannot be read as JSON ({e})")
        problem = _validate_document(raw)
        if problem:
            return _fallback(fallback, path, problem)
        policy = cls(accept=float(raw["accept"]), skip=float(raw["skip"]), source=str(path))
        log.debug("confidence thresholds accept=%.4f skip=%.4f from %s", *policy.pair, path)
        return policy

    @property
    def pair(self) -> tuple[float, float]:
        return (self.accept, self.skip)

    def label(self, score: float) -> ConfidenceLabel:
        """Label one cosine similarity. NaN is never trusted; out-of-range values raise."""
        if math.isnan(score):
            return "below_skip"
        if not -1.0 - _COSINE_SLACK <= score <= 1.0 + _COSINE_SLACK:
            raise ValueError(
                f"score {score!r} is outside [-1, 1]: ConfidencePolicy expects a cosine "
                "similarity (higher = closer), not a distance; convert with 1 - distance "
                "or fix the vector store's metric"
            )
        if score >= self.accept:
            return "confident"
        if score >= self.skip:
            return "low_confidence"
        return "below_skip"

    def to_dict(self) -> dict[str, Any]:
        return {"accept": self.accept, "skip": self.skip, "source": self.source}


def _fallback(fallback: ConfidencePolicy, path: Path, problem: str) -> ConfidencePolicy:
    log.warning(
        "thresholds file %s is malformed: %s; falling back to accept=%.2f skip=%.2f (%s). "
        "Re-run `ctx eval calibrate` or fix the file.",
        path,
        problem,
        fallback.accept,
        fallback.skip,
        fallback.source,
    )
    return fallback


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_pair(accept: Any, skip: Any) -> str | None:
    for name, v in (("accept", accept), ("skip", skip)):
        if not _is_number(v):
            return f'"{name}" must be a finite number, got {v!r}'
        if not -1.0 <= float(v) <= 1.0:
            return f'"{name}" = {v} is outside [-1, 1] (thresholds are cosine similarities)'
    if float(skip) > float(accept):
        return f'"skip" ({skip}) must not exceed "accept" ({accept})'
    return None


def _validate_document(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return f"expected a JSON object, got {type(raw).__name__}"
    missing = [k for k in ("accept", "skip") if k not in raw]
    if missing:
        return f"missing key(s) {', '.join(repr(k) for k in missing)}"
    return _check_pair(raw["accept"], raw["skip"])
