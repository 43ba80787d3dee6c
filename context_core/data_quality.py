"""Data-quality gates over Great Expectations 1.x, shared by ingestion and evaluation.

Why a helper: every batch job in the platform must refuse to write when its input breaks a
contract, and the operator must learn *which rows* broke it. Great Expectations gives us the
checks; this module fixes one way of running them (ephemeral context, pandas data source, a
whole-dataframe batch definition, the frame passed at run time, one suite per contract) and
turns GX's result objects into a small report and a :class:`DataValidationError` whose lines
name the expectation, the column and the failing row ids.

Building a GX context and its suites costs far more than validating a few thousand rows, so the
context, the data source and each (suite, expectations) validation definition are built once per
process and reused; only the dataframe changes between calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from context_core.errors import DataValidationError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ExpectationOutcome",
    "ExpectationSpec",
    "ValidationReport",
    "validate_frame",
]

_MAX_IDS_IN_MESSAGE = 10


@dataclass(frozen=True, slots=True)
class ExpectationSpec:
    """One expectation of a contract, as data (so a suite can be fingerprinted and cached).

    ``type`` is the GX class name (``"ExpectColumnValuesToNotBeNull"``) or its snake_case
    expectation type (``"expect_column_values_to_not_be_null"``); ``kwargs`` go to its
    constructor (``column``, ``regex``, ``max_value``, ...). ``meaning`` is a short plain-words
    statement of the rule, used in failure messages.
    """

    type: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    meaning: str = ""

    @property
    def column(self) -> str | None:
        col = self.kwargs.get("column")
        return str(col) if col is not None else None


@dataclass(frozen=True, slots=True)
class ExpectationOutcome:
    """Result of one expectation on one frame."""

    expectation: str
    column: str | None
    success: bool
    unexpected_count: int
    row_ids: tuple[str, ...]
    meaning: str = ""
    observed: Any = None
    error: str | None = None

    def describe(self) -> str:
        """One line naming the rule, the column and the failing rows (for error messages)."""
        where = f" on column {self.column!r}" if self.column else ""
        what = f" ({self.meaning})" if self.meaning else ""
        if self.error:
            return f"{self.expectation}{where}{what} could not run: {self.error}"
        if self.row_ids:
            shown = ", ".join(self.row_ids[:_MAX_IDS_IN_MESSAGE])
            more = len(self.row_ids) - _MAX_IDS_IN_MESSAGE
            tail = f" and {more} more" if more > 0 else ""
            return (
                f"{self.expectation}{where}{what} failed for {self.unexpected_count} row(s): "
                f"{shown}{tail}"
            )
        return f"{self.expectation}{where}{what} failed (observed: {self.observed!r})"


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """What a suite said about one frame."""

    suite_name: str
    success: bool
    n_rows: int
    outcomes: tuple[ExpectationOutcome, ...]

    @property
    def failures(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(o for o in self.outcomes if not o.success)

    @property
    def failing_row_ids(self) -> frozenset[str]:
        return frozenset(rid for o in self.failures for rid in o.row_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite_name,
            "success": self.success,
            "n_rows": self.n_rows,
            "failures": [
                {
                    "expectation": o.expectation,
                    "column": o.column,
                    "unexpected_count": o.unexpected_count,
                    "row_ids": list(o.row_ids),
                    "error": o.error,
                }
                for o in self.failures
            ],
        }


# --------------------------------------------------------------------------------------------
# Process-wide GX objects. A lock guards them: GX contexts are not documented as thread-safe.
# --------------------------------------------------------------------------------------------
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _class_name(type_name: str) -> str:
    if type_name.startswith("Expect"):
        return type_name
    return "".join(part.capitalize() for part in type_name.split("_"))


def _gx_context() -> tuple[Any, Any]:
    """The ephemeral context and its whole-dataframe batch definition, built once."""
    if "context" not in _STATE:
        # Must be set before GX reads its config: no usage statistics leave this machine.
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        # GX logs its set-up (temp docs dirs, registry notes) at INFO, and one of its modules
        # pins its own logger to INFO: noise in a job's log. Set after import, on purpose.
        for name in ("great_expectations", "great_expectations.data_context.types.base"):
            logging.getLogger(name).setLevel(logging.WARNING)

        context = gx.get_context(mode="ephemeral")
        # tqdm bars on every validation would drown the CLI's own rich progress bars.
        context.variables.progress_bars = ProgressBarsConfig(
            globally=False, metric_calculations=False
        )
        source = context.data_sources.add_pandas(name="frames")
        asset = source.add_dataframe_asset(name="frame")
        _STATE["batch_definition"] = asset.add_batch_definition_whole_dataframe("whole_frame")
        _STATE["context"] = context
        _STATE["definitions"] = {}
    return _STATE["context"], _STATE["batch_definition"]


def _validation_definition(suite_name: str, specs: Sequence[ExpectationSpec]) -> Any:
    """One ValidationDefinition per (suite name, exact expectations), cached."""
    import great_expectations as gx

    context, batch_definition = _gx_context()
    fingerprint = hashlib.sha256(
        json.dumps([[s.type, dict(s.kwargs)] for s in specs], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    key = f"{suite_name}-{fingerprint}"
    cache: dict[str, Any] = _STATE["definitions"]
    if key in cache:
        return cache[key]
    suite = gx.ExpectationSuite(name=key)
    for spec in specs:
        cls = getattr(gx.expectations, _class_name(spec.type), None)
        if cls is None:
            raise ValueError(
                f"suite {suite_name!r}: unknown Great Expectations expectation {spec.type!r}; "
                "use a class name from great_expectations.expectations"
            )
        suite.add_expectation(cls(**dict(spec.kwargs)))
    suite = context.suites.add(suite)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=key, data=batch_definition, suite=suite)
    )
    cache[key] = definition
    return definition


def _row_ids(result: Mapping[str, Any], row_id_column: str | None) -> tuple[str, ...]:
    rows = result.get("unexpected_index_list") or []
    ids: list[str] = []
    for row in rows:
        if isinstance(row, Mapping) and row_id_column and row_id_column in row:
            ids.append(str(row[row_id_column]))
        else:
            ids.append(str(row))
    return tuple(dict.fromkeys(ids))  # keep order, drop repeats (compound checks)


def validate_frame(
    df: pd.DataFrame,
    *,
    suite_name: str,
    expectations: Sequence[ExpectationSpec],
    row_id_column: str | None = None,
    raise_on_failure: bool = True,
) -> ValidationReport:
    """Run the suite ``suite_name`` (the given expectations) over ``df``.

    ``row_id_column`` names the column whose values identify rows in failure messages (e.g. a
    page path + chunk index); without it GX's positional indexes are reported. When the suite
    fails and ``raise_on_failure`` is true, :class:`DataValidationError` is raised listing every
    failing expectation with its column and row ids; otherwise the report is returned.
    """
    missing = sorted(
        {s.column for s in expectations if s.column is not None} - {str(c) for c in df.columns}
    )
    if row_id_column is not None and row_id_column not in df.columns:
        missing.append(row_id_column)
    if missing:
        raise DataValidationError(
            f"suite {suite_name!r}: the frame lacks column(s) the contract needs",
            [f"missing column {c!r} (present: {', '.join(map(str, df.columns))})" for c in missing],
        )
    result_format: dict[str, Any] = {"result_format": "COMPLETE"}
    if row_id_column is not None:
        result_format["unexpected_index_column_names"] = [row_id_column]

    with _LOCK:
        definition = _validation_definition(suite_name, expectations)
        run = definition.run(batch_parameters={"dataframe": df}, result_format=result_format)

    meaning_by_key = {(_class_name(s.type), s.column): s.meaning for s in expectations}
    outcomes: list[ExpectationOutcome] = []
    for r in run.results:
        config = r.expectation_config
        column = config.kwargs.get("column")
        name = _class_name(config.type)
        info = r.exception_info or {}
        error = None
        if info.get("raised_exception"):
            error = str(info.get("exception_message") or "exception in expectation")
        result = r.result or {}
        outcomes.append(
            ExpectationOutcome(
                expectation=name,
                column=str(column) if column is not None else None,
                success=bool(r.success),
                unexpected_count=int(result.get("unexpected_count") or 0),
                row_ids=_row_ids(result, row_id_column) if not r.success else (),
                meaning=meaning_by_key.get((name, column), ""),
                observed=result.get("observed_value"),
                error=error,
            )
        )
    report = ValidationReport(
        suite_name=suite_name,
        success=bool(run.success),
        n_rows=len(df),
        outcomes=tuple(outcomes),
    )
    if raise_on_failure and not report.success:
        raise DataValidationError(
            f"data-quality suite {suite_name!r} failed on {len(report.failing_row_ids)} of "
            f"{report.n_rows} row(s); nothing was written",
            [o.describe() for o in report.failures],
        )
    return report
