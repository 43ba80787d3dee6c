"""Labelled retrieval hits: the input of threshold calibration.

A labels file says, for each (query, retrieved point) pair, the similarity the retriever gave it
and whether a person (or a qrels file) judged it relevant. Calibration is only as good as this
file, so it passes a Great Expectations suite before anything is computed, and a failure names
the offending rows (1-based data rows, plus their query_id/point_id) so they can be fixed.

Accepted formats: CSV with a header, or JSONL (one object per line). Columns:
``query_id, query, point_id, similarity, label`` and optionally ``annotator`` and the
relevance model's extra features (:data:`FEATURE_COLUMNS`: ``sparse_score`` >= 0, ``rank``
>= 1, ``margin``, ``query_len`` >= 0; the retrieval jobs write them). A file without them is
as valid as before: the relevance model then uses the cosine alone and says so.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from context_core.errors import DataValidationError
from context_core.fsutil import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CANDIDATE_COLUMNS",
    "FEATURE_COLUMNS",
    "LABEL_COLUMNS",
    "Candidate",
    "LabelSet",
    "Query",
    "export_candidates",
    "label_set_from_frame",
    "load_labels",
    "read_labels",
    "read_queries",
    "validate_labels",
    "write_candidates_csv",
]

LABEL_COLUMNS: tuple[str, ...] = ("query_id", "query", "point_id", "similarity", "label")
FEATURE_COLUMNS: tuple[str, ...] = ("sparse_score", "rank", "margin", "query_len")
OPTIONAL_COLUMNS: tuple[str, ...] = ("annotator", *FEATURE_COLUMNS)
# lower bound of each optional feature column (None: any number)
_FEATURE_MIN: dict[str, float | None] = {
    "sparse_score": 0.0,
    "rank": 1.0,
    "margin": None,
    "query_len": 0.0,
}
CANDIDATE_COLUMNS: tuple[str, ...] = (
    "query_id",
    "query",
    "point_id",
    "source",
    "section",
    "similarity",
    "text",
    "label",
)
DEFAULT_MIN_ROWS = 20
_SNIPPET_CHARS = 300


@dataclass(frozen=True, eq=False)
class LabelSet:
    """A validated labels file. ``frame`` is a private copy; ``scores``/``labels`` are read-only."""

    frame: pd.DataFrame
    sha256: str
    path: Path | None

    @property
    def scores(self) -> np.ndarray:
        arr = self.frame["similarity"].to_numpy(dtype=float, copy=True)
        arr.flags.writeable = False
        return arr

    @property
    def labels(self) -> np.ndarray:
        arr = self.frame["label"].to_numpy(dtype=int, copy=True)
        arr.flags.writeable = False
        return arr

    @property
    def n(self) -> int:
        return len(self.frame)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def read_labels(path: Path | str) -> pd.DataFrame:
    """Read a labels CSV/JSONL into a DataFrame; values are checked by :func:`validate_labels`.

    Missing required columns are reported here, with the expected header, because nothing
    further can be checked without them.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DataValidationError(f"labels file {path} does not exist")
    try:
        if path.suffix.lower() in {".jsonl", ".ndjson", ".json"}:
            frame = pd.read_json(path, lines=True, dtype={"query_id": str, "point_id": str})
        else:
            frame = pd.read_csv(path, dtype={"query_id": str, "point_id": str, "query": str})
    except ValueError as e:  # pandas parse errors (bad JSON line, ragged CSV) are ValueErrors
        raise DataValidationError(f"labels file {path} could not be parsed: {e}") from e
    missing = [c for c in LABEL_COLUMNS if c not in frame.columns]
    if missing:
        raise DataValidationError(
            f"labels file {path} lacks column(s) {', '.join(missing)}; expected header: "
            f"{','.join(LABEL_COLUMNS)}[,annotator][,{','.join(FEATURE_COLUMNS)}]"
        )
    return frame


_ROW = "_row"  # helper column naming each row in failure messages


def _label_specs(min_rows: int, columns: Iterable[str] = ()) -> list[Any]:
    from context_core.data_quality import ExpectationSpec as Spec

    specs = [
        Spec("ExpectColumnValuesToNotBeNull", {"column": c}, f"{c} is empty or not a number")
        for c in LABEL_COLUMNS
    ]
    specs += [
        Spec("ExpectColumnValuesToBeInSet", {"column": "label", "value_set": [0, 1]}, "label"),
        Spec(
            "ExpectColumnValuesToBeBetween",
            {"column": "similarity", "min_value": -1.0, "max_value": 1.0},
            "similarity",
        ),
        Spec(
            "ExpectCompoundColumnsToBeUnique",
            {"column_list": ["query_id", "point_id"]},
            "duplicate (query_id, point_id) pair",
        ),
        Spec(
            "ExpectColumnDistinctValuesToContainSet",
            {"column": "label", "value_set": [0, 1]},
            "both classes",
        ),
        Spec("ExpectTableRowCountToBeBetween", {"min_value": min_rows}, "row count"),
    ]
    present = set(columns)
    specs += [
        Spec(
            "ExpectColumnValuesToBeBetween",
            {"column": c, "min_value": low},
            f"{c} must be a number >= {low:g} (or empty)",
        )
        for c, low in _FEATURE_MIN.items()
        if c in present and low is not None
    ]
    return specs


def _gx_suite_failures(frame: pd.DataFrame, min_rows: int) -> list[str]:
    """Run the labels expectation suite; return one readable line per failing row/check."""
    from context_core.data_quality import validate_frame

    named = frame.copy()
    named[_ROW] = [
        f"row {i + 1} (query_id={q}, point_id={p})"
        for i, (q, p) in enumerate(zip(frame["query_id"], frame["point_id"], strict=True))
    ]
    report = validate_frame(
        named,
        suite_name="retrieval_labels",
        expectations=_label_specs(min_rows, frame.columns),
        row_id_column=_ROW,
        raise_on_failure=False,
    )
    by_name = dict(zip(named[_ROW], range(len(named)), strict=True))
    failures: list[str] = []
    for o in report.failures:
        if o.error:
            failures.append(o.describe())
        elif o.expectation == "ExpectColumnValuesToNotBeNull":
            failures += [f"{r}: {o.meaning}" for r in o.row_ids]
        elif o.expectation == "ExpectColumnValuesToBeInSet":
            failures += [
                f"{r}: label={_show(frame.loc[by_name[r], 'label'])} is not 0 or 1"
                for r in o.row_ids
            ]
        elif o.expectation == "ExpectColumnValuesToBeBetween" and o.meaning != "similarity":
            failures += [f"{r}: {o.meaning}" for r in o.row_ids]
        elif o.expectation == "ExpectColumnValuesToBeBetween":
            failures += [
                f"{r}: similarity={_show(frame.loc[by_name[r], 'similarity'])} is outside [-1, 1]"
                for r in o.row_ids
            ]
        elif o.expectation == "ExpectCompoundColumnsToBeUnique":
            failures += [f"{r}: {o.meaning}" for r in o.row_ids]
        elif o.expectation == "ExpectColumnDistinctValuesToContainSet":
            present = sorted({_show(v) for v in frame["label"].dropna()})
            failures.append(
                f"labels must contain both classes 0 and 1; found only {present or 'none'}"
            )
        elif o.expectation == "ExpectTableRowCountToBeBetween":
            failures.append(
                f"only {len(frame)} rows; calibration needs at least {min_rows} "
                "(pass min_rows / --min-rows to change)"
            )
        else:  # pragma: no cover - every expectation above is handled
            failures.append(o.describe())
    return failures


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def validate_labels(
    frame: pd.DataFrame, *, min_rows: int = DEFAULT_MIN_ROWS, source: str = "labels"
) -> pd.DataFrame:
    """Validate labelled hits with the Great Expectations suite; return a typed copy.

    Checks: required columns non-empty, ``label`` in {0, 1}, ``similarity`` in [-1, 1], no
    duplicate (query_id, point_id), both classes present, at least ``min_rows`` rows.
    Raises :class:`DataValidationError` listing every failing row; the input is not modified.
    """
    import pandas as pd

    missing = [c for c in LABEL_COLUMNS if c not in frame.columns]
    if missing:
        raise DataValidationError(
            f"{source} lacks column(s) {', '.join(missing)}; expected header: "
            f"{','.join(LABEL_COLUMNS)}[,annotator][,{','.join(FEATURE_COLUMNS)}]"
        )
    typed = frame.reset_index(drop=True).copy()
    typed["query_id"] = typed["query_id"].astype(str)
    typed["point_id"] = typed["point_id"].astype(str)
    # Non-numeric text becomes NaN, which the not-null expectation then names by row.
    typed["similarity"] = pd.to_numeric(typed["similarity"], errors="coerce")
    typed["label"] = pd.to_numeric(typed["label"], errors="coerce")
    for col in FEATURE_COLUMNS:  # optional: a gap or text leaves the feature out of the model
        if col in typed.columns:
            typed[col] = pd.to_numeric(typed[col], errors="coerce")
    failures = _gx_suite_failures(typed, min_rows)
    if failures:
        raise DataValidationError(f"{source} failed validation; nothing was calibrated", failures)
    typed["label"] = typed["label"].astype(int)
    typed["similarity"] = typed["similarity"].astype(float)
    return typed


def label_set_from_frame(
    frame: pd.DataFrame, *, min_rows: int = DEFAULT_MIN_ROWS, source: str = "labels"
) -> LabelSet:
    """Validate an in-memory frame (e.g. built in a notebook or by the BEIR runner)."""
    typed = validate_labels(frame, min_rows=min_rows, source=source)
    payload = typed[list(LABEL_COLUMNS)].to_csv(index=False).encode()
    return LabelSet(frame=typed, sha256=hashlib.sha256(payload).hexdigest(), path=None)


def load_labels(path: Path | str, *, min_rows: int = DEFAULT_MIN_ROWS) -> LabelSet:
    """Read and validate a labels file; the sha256 of the file goes into provenance."""
    path = Path(path)
    typed = validate_labels(read_labels(path), min_rows=min_rows, source=f"labels file {path}")
    return LabelSet(frame=typed, sha256=_sha256_file(path), path=path)


# --- candidates for annotation ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    query_id: str
    text: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """One retrieved hit awaiting a human label (``label`` left empty in the CSV)."""

    query_id: str
    query: str
    point_id: str
    source: str
    section: str
    similarity: float
    text: str


def read_queries(path: Path | str) -> list[Query]:
    """Read a query file: JSONL with ``query_id``/``query`` or BEIR's ``_id``/``text``."""
    path = Path(path)
    if not path.is_file():
        raise DataValidationError(f"query file {path} does not exist")
    queries: list[Query] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataValidationError(f"{path} line {lineno} is not JSON: {e}") from e
            qid = obj.get("query_id", obj.get("_id"))
            text = obj.get("query", obj.get("text"))
            if qid is None or not text:
                raise DataValidationError(
                    f"{path} line {lineno} needs 'query_id' and 'query' (or BEIR '_id' and 'text')"
                )
            queries.append(Query(str(qid), str(text)))
    return queries


SearchFn = Callable[[str, int], Sequence[Any]]
"""``search(query_text, k) -> hits`` where each hit has ``id``, ``score`` and ``payload``."""


def export_candidates(
    queries: Iterable[Query], search: SearchFn, *, k: int = 10
) -> list[Candidate]:
    """Top-``k`` hits per query, flattened into rows ready for annotation."""
    if k <= 0:
        raise ValueError("k must be positive")
    rows: list[Candidate] = []
    for q in queries:
        for hit in search(q.text, k):
            payload = hit.payload or {}
            text = " ".join(str(payload.get("text", "")).split())
            rows.append(
                Candidate(
                    query_id=q.query_id,
                    query=q.text,
                    point_id=str(hit.id),
                    source=str(payload.get("source", "")),
                    section=str(payload.get("section", "")),
                    similarity=round(float(hit.score), 6),
                    text=text[:_SNIPPET_CHARS],
                )
            )
    return rows


def write_candidates_csv(candidates: Sequence[Candidate], path: Path | str) -> Path:
    """Write candidates with an empty ``label`` column; the header matches :data:`LABEL_COLUMNS`."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(CANDIDATE_COLUMNS)
    for c in candidates:
        writer.writerow(
            [c.query_id, c.query, c.point_id, c.source, c.section, c.similarity, c.text, ""]
        )
    return atomic_write_text(path, buf.getvalue())
