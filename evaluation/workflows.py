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
    from evaluation.relevance_calibration import RelevanceFit

__all__ = ["LabelsCalibration", "calibrate_labels_file"]


@dataclass(frozen=True)
class LabelsCalibration:
    result: CalibrationResult
    change: LabelChange
    thresholds_path: Path
    report: Mapping[str, Path]
    relevance: RelevanceFit | None = None
    relevance_path: Path | None = None

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
            "relevance": None
            if self.relevance is None
            else {
                "kind": self.relevance.kind,
                "candidate": self.relevance.chosen,
                "features": list(self.relevance.model.features),
                "accept": self.relevance.model.accept,
                "skip": self.relevance.model.skip,
                "held_out": self.relevance.summary()["held_out"],
                "path": str(self.relevance_path),
            },
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
    relevance: bool = True,
    **calib_kwargs: Any,
) -> LabelsCalibration:
    """Validate ``labels_path``, calibrate, write thresholds (default: the file the router
    reads) and ``<reports>/<report_name>_report.md``; compare with the thresholds in force.

    With ``relevance`` the relevance model (``p_relevant``) is fitted on the same labels and
    written next to the thresholds (:func:`context_core.routing.relevance.relevance_path_for`: the
    router's ``relevance_model.json`` when the thresholds are the router's)."""
    from context_core.routing.confidence import ConfidencePolicy, model_name
    from context_core.routing.relevance import relevance_path_for
    from evaluation.calibration import (
        Provenance,
        calibrate,
        compare_with_current,
        write_thresholds,
    )
    from evaluation.labels import load_labels
    from evaluation.relevance_calibration import try_fit_relevance, write_relevance_model
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
    fit, note = try_fit_relevance(
        labels,
        model=prov.model,
        dataset=Path(labels_path).stem,
        enabled=relevance,
        calib_kwargs=calib_kwargs,
    )
    rel_path = None
    if fit is not None:
        rel_path = write_relevance_model(fit.model, relevance_path_for(target))
    change = compare_with_current(result, labels, current.accept, current.skip)
    paths = write_calibration_report(
        result,
        settings.reports_dir,
        provenance=prov,
        change=change,
        name=report_name,
        thresholds_path=target,
        relevance=fit,
        relevance_path=rel_path,
        relevance_note=note,
    )
    return LabelsCalibration(
        result=result,
        change=change,
        thresholds_path=target,
        report=paths,
        relevance=fit,
        relevance_path=rel_path,
    )
