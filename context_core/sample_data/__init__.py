"""Bundled sample data: a small Confluence HTML export (space EQM) and BEIR-style eval queries.

Written for this project: SOPs, troubleshooting guides and resolved cases for centrifugal
pumps (PUMP), fans (FAN) and screw compressors (COMP), some pages in Chinese, plus one
deliberately empty page that the reader must quarantine.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["sample_eval_dir", "sample_export_path"]


def sample_export_path() -> Path:
    """Folder of the sample "Export space -> HTML" (pass it to ``read_html_export``)."""
    return Path(__file__).resolve().parent / "confluence" / "EQM"


def sample_eval_dir() -> Path:
    """Folder with ``queries.jsonl`` ({"_id", "text"}) and ``qrels.tsv`` (query-id, corpus-id
    = page id, score 2 = answers it, 1 = partly relevant); queries without qrels rows are
    deliberately unanswerable from the sample space."""
    return Path(__file__).resolve().parent / "eval"
