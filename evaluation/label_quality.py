"""Label quality checks, run on a labels file before anything is fitted.

A calibration is only as good as its labels; these checks look at what the schema suite
(:func:`evaluation.labels.validate_labels`) cannot see. Each finding has a name, says whether
it blocks the fit, and names the rows or the annotators concerned:

* ``duplicate_rows`` (reported): the same (query_id, point_id[, annotator]) with the same label
  more than once; the copies are dropped before fitting.
* ``conflicting_labels`` (blocking): the same (query_id, point_id) labelled both 0 and 1 by
  the same annotator (or in a file without an ``annotator`` column): such a hit has no label
  to fit on, and the file says two things at once.
* ``annotator_ties`` (reported): annotators split evenly on a hit; it has no majority label and
  is left out of the fit.
* ``annotator_agreement`` (blocking below :data:`MIN_KAPPA`): Cohen's kappa for each pair of
  annotators over the hits both labelled (at least :data:`MIN_OVERLAP`), when an
  ``annotator`` column exists. One annotator disagreeing with the others shows as low kappa
  in every pair that includes them.
* ``queries_without_positive`` (reported): queries none of whose hits is relevant (the
  retriever found nothing useful for them, or the annotator missed it).

With several annotators per hit the hit's label is the majority vote (one row per hit goes on
to validation and fitting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.errors import DataValidationError

if TYPE_CHECKING:
    import pandas as pd

    from evaluation.labels import LabelSet

__all__ = [
    "MIN_KAPPA",
    "MIN_OVERLAP",
    "LabelQuality",
    "QualityFinding",
    "check_label_quality",
    "load_checked_labels",
]

MIN_KAPPA = 0.4  # below "moderate" agreement (Landis & Koch) the labels are not one judgement
MIN_OVERLAP = 10  # hits two annotators must share before their kappa means anything
_SHOW = 10  # rows named per finding


@dataclass(frozen=True, slots=True)
class QualityFinding:
    name: str
    blocking: bool
    message: str
    rows: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "blocking": self.blocking,
            "message": self.message,
            "rows": list(self.rows),
        }

    def describe(self) -> str:
        shown = "; ".join(self.rows[:_SHOW])
        more = f" (+{len(self.rows) - _SHOW} more)" if len(self.rows) > _SHOW else ""
        kind = "BLOCKING" if self.blocking else "note"
        return f"{kind} {self.name}: {self.message}" + (f": {shown}{more}" if shown else "")


@dataclass(frozen=True, eq=False)
class LabelQuality:
    """The findings and the frame that goes on to validation (one row per hit)."""

    findings: tuple[QualityFinding, ...]
    frame: pd.DataFrame = field(repr=False)
    kappa: dict[str, float] = field(default_factory=dict)  # "a|b" -> Cohen's kappa

    @property
    def blocking(self) -> tuple[QualityFinding, ...]:
        return tuple(f for f in self.findings if f.blocking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "kappa": dict(self.kappa),
            "rows_after": len(self.frame),
        }


def _row_name(i: int, q: Any, p: Any) -> str:
    return f"row {i + 1} (query_id={q}, point_id={p})"


def check_label_quality(raw: pd.DataFrame) -> LabelQuality:
    """Run the checks on a raw labels frame (as read from the file); the input is not modified.

    Rows whose ``label`` is not 0/1 are left as they are for the schema suite to name.
    """
    import pandas as pd

    frame = raw.reset_index(drop=True).copy()
    if not {"query_id", "point_id", "label"} <= set(frame.columns):
        return LabelQuality((), frame)  # the schema suite names the missing columns
    frame["query_id"] = frame["query_id"].astype(str)
    frame["point_id"] = frame["point_id"].astype(str)
    lab = pd.to_numeric(frame["label"], errors="coerce")
    ok = lab.isin([0, 1])
    has_annot = "annotator" in frame.columns
    if has_annot:
        frame["annotator"] = frame["annotator"].fillna("").astype(str)
    names = [_row_name(i, q, p) for i, (q, p) in enumerate(zip(frame["query_id"],
             frame["point_id"], strict=True))]  # fmt: skip
    findings: list[QualityFinding] = []
    key = ["query_id", "point_id", *(["annotator"] if has_annot else [])]

    # duplicates: same key, same label -> keep the first
    dup = frame.assign(_lab=lab).duplicated(subset=[*key, "_lab"], keep="first") & ok
    if dup.any():
        findings.append(
            QualityFinding(
                "duplicate_rows",
                False,
                f"{int(dup.sum())} row(s) repeat an earlier row with the same label; the "
                "copies are ignored",
                tuple(names[i] for i in dup[dup].index),
            )
        )
    keep = ~dup
    frame, lab, ok = frame[keep], lab[keep], ok[keep]

    # conflicts within one judge (or a file without annotators)
    both = frame[ok].assign(_lab=lab[ok]).groupby(key)["_lab"].nunique()
    conflicted = set(both[both > 1].index)
    conflict_rows = [
        names[i] for i, row in frame[ok].iterrows() if tuple(row[k] for k in key) in conflicted
    ]
    kappa: dict[str, float] = {}
    if has_annot:
        kappa, kappa_findings, ties = _annotators(frame[ok], lab[ok])
        findings += kappa_findings
        if ties:
            findings.append(
                QualityFinding(
                    "annotator_ties",
                    False,
                    f"{len(ties)} hit(s) split evenly between annotators: no majority label, "
                    "left out of the fit (add a tie-breaking annotator to keep them)",
                    tuple(f"query_id={q}, point_id={p}" for q, p in sorted(ties)),
                )
            )
    if conflict_rows:
        findings.append(
            QualityFinding(
                "conflicting_labels",
                True,
                "the same (query_id, point_id) is labelled both 0 and 1"
                + (" by the same annotator" if has_annot else "")
                + "; decide each such hit's label, keep one row for it, and re-run",
                tuple(dict.fromkeys(conflict_rows)),
            )
        )

    # majority vote per hit (annotators), one row per hit for validation and fitting
    if has_annot and ok.all():
        frame = _majority(frame.assign(label=lab.astype(int)))
    # queries without a positive
    if ok.all() and len(frame):
        per_q = pd.to_numeric(frame["label"]).groupby(frame["query_id"]).max()
        empty = sorted(str(q) for q in per_q[per_q < 1].index)
        if empty:
            findings.append(
                QualityFinding(
                    "queries_without_positive",
                    False,
                    f"{len(empty)} of {len(per_q)} queries have no relevant hit (the retriever "
                    "found nothing useful, or a relevant hit was missed)",
                    tuple(f"query_id={q}" for q in empty),
                )
            )
    return LabelQuality(tuple(findings), frame.reset_index(drop=True), kappa)


def _annotators(
    frame: pd.DataFrame, lab: pd.Series
) -> tuple[dict[str, float], list[QualityFinding], set[tuple[str, str]]]:
    from sklearn.metrics import cohen_kappa_score

    votes = frame.assign(_lab=lab.astype(int))
    wide = votes.pivot_table(
        index=["query_id", "point_id"], columns="annotator", values="_lab", aggfunc="first"
    )
    kappa: dict[str, float] = {}
    low: list[str] = []
    for a, b in combinations(sorted(str(c) for c in wide.columns), 2):
        both = wide[[a, b]].dropna()
        if len(both) < MIN_OVERLAP:
            continue
        x, y = both[a].astype(int), both[b].astype(int)
        if x.nunique() == 1 and y.nunique() == 1:
            k = 1.0 if (x == y).all() else 0.0  # kappa undefined: one class each
        else:
            k = float(cohen_kappa_score(x, y))
        kappa[f"{a}|{b}"] = round(k, 4)
        if k < MIN_KAPPA:
            low.append(f"{a} vs {b}: kappa {k:.2f} on {len(both)} shared hits")
    findings = []
    if low:
        findings.append(
            QualityFinding(
                "annotator_agreement",
                True,
                f"annotators disagree (Cohen's kappa < {MIN_KAPPA}); align them on the "
                "relevance guideline and re-label, or drop the outlying annotator's rows",
                tuple(low),
            )
        )
    counts = votes.groupby(["query_id", "point_id"])["_lab"].agg(["sum", "count"])
    multi = counts[counts["count"] > 1]
    ties = {
        (str(q), str(p)) for (q, p), r in multi.iterrows() if 2 * int(r["sum"]) == int(r["count"])
    }
    return kappa, findings, ties


def _majority(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per hit labelled by majority; evenly split hits are dropped."""
    votes = frame.groupby(["query_id", "point_id"], sort=False)["label"].mean()
    first = frame.drop_duplicates(subset=["query_id", "point_id"], keep="first").copy()
    share = [float(votes[(q, p)]) for q, p in zip(first["query_id"], first["point_id"],
             strict=True)]  # fmt: skip
    first["label"] = [int(v > 0.5) for v in share]
    return first[[v != 0.5 for v in share]]


def load_checked_labels(path: Path | str, *, min_rows: int = 20) -> tuple[LabelSet, LabelQuality]:
    """Read a labels file, run the quality checks, then the schema suite.

    A blocking finding raises :class:`DataValidationError` naming it and its rows; nothing is
    fitted. The label set's sha256 is the file's, as :func:`evaluation.labels.load_labels`.
    """
    from evaluation.labels import LabelSet, _sha256_file, read_labels, validate_labels

    path = Path(path)
    quality = check_label_quality(read_labels(path))
    if quality.blocking:
        raise DataValidationError(
            f"labels file {path} failed the label quality checks "
            f"({', '.join(f.name for f in quality.blocking)}); nothing was calibrated",
            [f.describe() for f in quality.blocking],
        )
    typed = validate_labels(quality.frame, min_rows=min_rows, source=f"labels file {path}")
    return LabelSet(frame=typed, sha256=_sha256_file(path), path=path), quality


def summarize(findings: Sequence[QualityFinding]) -> list[str]:
    """One line per finding, for the CLI and the report."""
    return [f.describe() for f in findings]
