"""Real Great Expectations suites: the generic helper and the chunk contract."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from context_core.data_quality import ExpectationSpec, validate_frame
from context_core.errors import DataValidationError
from context_core.ingest.validation import validate_chunks


def _row(i: int, **over: Any) -> dict[str, Any]:
    row = {
        "row_id": f"EQM/page_{i}.html#0",
        "point_id": f"00000000-0000-5000-8000-{i:012d}",
        "source": f"page-{i}",
        "section": "PUMP",
        "text": f"Check the seal of pump {i} every week.",
        "n_tokens": 12,
        "updated_at": "2024-03-05T08:30:00+00:00",
    }
    row.update(over)
    return row


def test_valid_chunks_pass_and_report_counts() -> None:
    report = validate_chunks([_row(i) for i in range(4)], max_tokens=256)
    assert report.success
    assert report.n_rows == 4
    assert report.failures == ()
    assert len(report.outcomes) >= 10  # every rule of the contract ran


@pytest.mark.parametrize(
    ("override", "expectation", "column"),
    [
        ({"text": ""}, "ExpectColumnValuesToMatchRegex", "text"),
        ({"text": "  \n "}, "ExpectColumnValuesToMatchRegex", "text"),
        ({"text": None}, "ExpectColumnValuesToNotBeNull", "text"),
        ({"n_tokens": 257}, "ExpectColumnValuesToBeBetween", "n_tokens"),
        ({"updated_at": "Jun 29, 2019"}, "ExpectColumnValuesToMatchRegex", "updated_at"),
        (
            {"updated_at": "2024-02-30T00:00:00+00:00"},
            "ExpectColumnValuesToBeDateutilParseable",
            "updated_at",
        ),
        ({"section": ""}, "ExpectColumnValuesToMatchRegex", "section"),
        ({"source": None}, "ExpectColumnValuesToNotBeNull", "source"),
    ],
)
def test_each_rule_names_rule_column_and_row(
    override: dict[str, Any], expectation: str, column: str
) -> None:
    rows = [_row(0), _row(1, **override), _row(2)]
    with pytest.raises(DataValidationError) as exc:
        validate_chunks(rows, max_tokens=256)
    failures = exc.value.failures
    matching = [f for f in failures if f.startswith(expectation) and repr(column) in f]
    assert matching, failures
    assert "EQM/page_1.html#0" in matching[0]
    # The good rows are never blamed.
    assert not any("EQM/page_0.html#0" in f or "EQM/page_2.html#0" in f for f in failures)


def test_duplicate_point_ids_name_both_rows() -> None:
    dup = "00000000-0000-5000-8000-000000000001"
    rows = [_row(0), _row(1, point_id=dup), _row(2, point_id=dup)]
    report = validate_chunks(rows, max_tokens=256, raise_on_failure=False)
    assert not report.success
    (failure,) = report.failures
    assert failure.expectation == "ExpectColumnValuesToBeUnique"
    assert failure.column == "point_id"
    assert set(failure.row_ids) == {"EQM/page_1.html#0", "EQM/page_2.html#0"}
    assert report.failing_row_ids == {"EQM/page_1.html#0", "EQM/page_2.html#0"}


def test_token_limit_is_a_parameter() -> None:
    rows = [_row(0, n_tokens=100)]
    assert validate_chunks(rows, max_tokens=128).success
    report = validate_chunks(rows, max_tokens=64, raise_on_failure=False)
    assert [f.row_ids for f in report.failures] == [("EQM/page_0.html#0",)]


def test_generic_helper_other_contract_and_positional_ids() -> None:
    df = pd.DataFrame({"score": [0.1, 0.9, 1.5], "label": [0, 1, 1]})
    specs = [
        ExpectationSpec(
            "expect_column_values_to_be_between",
            {"column": "score", "min_value": 0.0, "max_value": 1.0},
            "a cosine",
        ),
        ExpectationSpec("ExpectColumnValuesToBeInSet", {"column": "label", "value_set": [0, 1]}),
    ]
    report = validate_frame(df, suite_name="labels", expectations=specs, raise_on_failure=False)
    assert not report.success
    (failure,) = report.failures
    assert failure.column == "score"
    assert failure.row_ids == ("2",)  # no id column given: GX's positional index
    assert "a cosine" in failure.describe()


def test_missing_column_is_a_clear_error() -> None:
    df = pd.DataFrame({"text": ["a"]})
    with pytest.raises(DataValidationError, match="missing column 'row_id'"):
        validate_frame(
            df,
            suite_name="x",
            expectations=[ExpectationSpec("ExpectColumnValuesToNotBeNull", {"column": "text"})],
            row_id_column="row_id",
        )


def test_unknown_expectation_is_a_clear_error() -> None:
    df = pd.DataFrame({"text": ["a"]})
    with pytest.raises(ValueError, match="unknown Great Expectations expectation"):
        validate_frame(
            df,
            suite_name="bad",
            expectations=[ExpectationSpec("ExpectTextToBeNice", {"column": "text"})],
        )
