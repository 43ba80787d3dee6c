"""End-to-end jobs shared by the CLI and the DAGs: labels file -> thresholds.json + report.

The pure steps (validate, calibrate, compare) and the writing steps stay in their modules;
this only wires them in the one order that is safe: validate before computing, compute before
writing, and write the runtime thresholds atomically.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from context_core.config import Settings
    from evaluation.calibration import CalibrationResult, LabelChange

__all__ = ["LabelsCalibration", "calibrate_labels_file"]


@dataclass(frozen=True)
class LabelsCalibration:
    result: CalibrationResult
    change: LabelChange
    thresholds_path: Path
    report: Mapping[str, Path]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for XCom, logs)."""
        r = self.result
        return {
            "accept": r.accept,
            "skip": r.skip,
            "auc": r.auc,
            "n": r.n,
            "changed_share": self.change.changed_share,
            "thresholds_path": str(self.thresholds_path),
            "report": {k: str(v) for k, v in self.report.items()},
        }


def calibrate_labels_file(
    labels_path: Path | str,
    settings: Settings,
    *,
    out: Path | None = None,
    min_rows: int = 20,
    model: str | None = None,
    collection: str | None = None,
    report_name: str = "calibration",
    **calib_kwargs: Any,
) -> LabelsCalibration:
    """Validate ``labels_path``, calibrate, write thresholds (default: the file the router
    reads) and ``<reports>/<report_name>_report.md``; compare with the thresholds in force."""
    from context_core.confidence import ConfidencePolicy, model_name
    from evaluation.calibration import (
        Provenance,
        calibrate,
        compare_with_current,
        write_thresholds,
    )
    from evaluation.labels import load_labels
    from evaluation.report import write_calibration_report

    current = ConfidencePolicy.load(settings)  # read before we overwrite it
    labels = load_labels(labels_path, min_rows=min_rows)
    result = calibrate(labels.scores, labels.labels, **calib_kwargs)
    prov = Provenance(
        model=model_name(model or settings.embed_model),
        collection=collection or settings.collection_main,
        labels_sha256=labels.sha256,
        labels_path=str(labels_path),
    ).filled()
    target = write_thresholds(result, out or settings.resolved_thresholds_path, prov)
    change = compare_with_current(result, labels, current.accept, current.skip)
    paths = write_calibration_report(
        result,
        settings.reports_dir,
        provenance=prov,
        change=change,
        name=report_name,
        thresholds_path=target,
    )
    return LabelsCalibration(result=result, change=change, thresholds_path=target, report=paths)
