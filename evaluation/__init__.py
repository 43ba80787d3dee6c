"""Evaluation for data scientists: threshold calibration, CER, the context-health report.

Pure functions over typed inputs return frozen dataclasses; writing (:mod:`evaluation.report`)
and drawing (:mod:`evaluation.plots`) are separate steps. Typical notebook use::

    from evaluation import load_labels, calibrate, compare_with_current
    labels = load_labels("labels.csv")            # Great Expectations suite, rows named on failure
    result = calibrate(labels.scores, labels.labels, accept_criterion="youden")
    compare_with_current(result, labels, 0.72, 0.65).changed_share
"""

from evaluation.beir import calibrate_beir, calibrate_sample
from evaluation.calibration import (
    CalibrationResult,
    Provenance,
    calibrate,
    compare_with_current,
    write_thresholds,
)
from evaluation.cer import StepVerdict, UseRule, compute_cer
from evaluation.health import run_health_report
from evaluation.labels import LabelSet, load_labels

__all__ = [
    "CalibrationResult",
    "LabelSet",
    "Provenance",
    "StepVerdict",
    "UseRule",
    "calibrate",
    "calibrate_beir",
    "calibrate_sample",
    "compare_with_current",
    "compute_cer",
    "load_labels",
    "run_health_report",
    "write_thresholds",
]
