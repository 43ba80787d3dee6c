"""The chunk contract: what every chunk must satisfy before anything is written to L3.

The pipeline builds one row per chunk it is about to embed and runs this suite on the whole
batch first; a failure stops the run before the first upsert and names the failing rows (row id
= ``<page source path>#<chunk index>``), so a bad export can never half-overwrite the knowledge
base.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from context_core.data_quality import ExpectationSpec, ValidationReport, validate_frame

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHUNK_COLUMNS", "CHUNK_SUITE", "chunk_expectations", "validate_chunks"]

CHUNK_SUITE = "knowledge_chunks"
#: Columns of the frame the suite checks (one row per chunk).
CHUNK_COLUMNS = ("row_id", "point_id", "source", "section", "text", "n_tokens", "updated_at")

# ISO-8601 with a time and an explicit offset (what datetime.isoformat() writes for aware times).
_ISO_8601 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:?\d{2})$"
_NON_BLANK = r"\S"


def chunk_expectations(max_tokens: int) -> tuple[ExpectationSpec, ...]:
    """The suite, parametrised by the embedding model's token limit."""
    specs: list[ExpectationSpec] = []
    for col in ("text", "source", "section"):
        specs.append(
            ExpectationSpec(
                "ExpectColumnValuesToNotBeNull", {"column": col}, f"{col} must be present"
            )
        )
        specs.append(
            ExpectationSpec(
                "ExpectColumnValuesToMatchRegex",
                {"column": col, "regex": _NON_BLANK},
                f"{col} must not be empty or whitespace",
            )
        )
    specs += [
        ExpectationSpec(
            "ExpectColumnValuesToNotBeNull", {"column": "n_tokens"}, "token count present"
        ),
        ExpectationSpec(
            "ExpectColumnValuesToBeBetween",
            {"column": "n_tokens", "min_value": 1, "max_value": max_tokens},
            f"1 <= tokens <= {max_tokens}",
        ),
        ExpectationSpec(
            "ExpectColumnValuesToNotBeNull", {"column": "point_id"}, "point id present"
        ),
        ExpectationSpec("ExpectColumnValuesToBeUnique", {"column": "point_id"}, "point ids unique"),
        ExpectationSpec(
            "ExpectColumnValuesToNotBeNull", {"column": "updated_at"}, "updated_at present"
        ),
        ExpectationSpec(
            "ExpectColumnValuesToMatchRegex",
            {"column": "updated_at", "regex": _ISO_8601},
            "updated_at is ISO-8601 with a UTC offset",
        ),
        # The regex checks the shape; this rejects impossible dates such as Feb 30.
        ExpectationSpec(
            "ExpectColumnValuesToBeDateutilParseable",
            {"column": "updated_at"},
            "updated_at is a real date",
        ),
    ]
    return tuple(specs)


def chunk_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows (dicts with :data:`CHUNK_COLUMNS`) -> the frame the suite validates."""
    import pandas as pd

    records = [{c: row.get(c) for c in CHUNK_COLUMNS} for row in rows]
    # object dtype keeps None as None (not NaN) in text columns and ints exact.
    return pd.DataFrame.from_records(records, columns=list(CHUNK_COLUMNS)).astype(object)


def validate_chunks(
    rows: Iterable[Mapping[str, Any]], *, max_tokens: int, raise_on_failure: bool = True
) -> ValidationReport:
    """Validate chunk rows; raises DataValidationError naming the failing ``row_id`` s."""
    return validate_frame(
        chunk_frame(rows),
        suite_name=CHUNK_SUITE,
        expectations=chunk_expectations(max_tokens),
        row_id_column="row_id",
        raise_on_failure=raise_on_failure,
    )
