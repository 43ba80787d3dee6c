"""End-to-end jobs shared by the CLI and the DAGs: labels file -> candidate -> gates -> promote.

The pure steps (quality checks, validate, calibrate, gates) and the writing steps stay in their
modules; this only wires them in the one order that is safe: check the labels before
computing, compute before writing, store the result as a versioned candidate, and promote it
(the only step that changes what the router reads) only when the gates pass or ``force``
says so with a reason (:mod:`evaluation.promotion`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.errors import PromotionError

if TYPE_CHECKING:
    from context_core.config import Settings
    from evaluation.calibration import CalibrationResult, LabelChange, Provenance
    from evaluation.label_quality import LabelQuality
    from evaluation.labels import LabelSet
    from evaluation.promotion import GateReport, Version
    from evaluation.relevance_calibration import RelevanceFit

__all__ = ["LabelsCalibration", "Staged", "calibrate_labels_file", "check_force", "stage"]


@dataclass(frozen=True)
class Staged:
    """A stored candidate, its gates, and whether it is now in force."""

    version: Version
    gates: GateReport
    promoted: bool
    in_force_path: Path

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version.id,
            "promoted": self.promoted,
            "failed_gates": self.gates.failed,
            "gates": self.gates.to_dict()["gates"],
        }


def check_force(force: bool, reason: str | None) -> None:
    """``--force`` needs a ``--reason`` (recorded in the provenance); checked before work."""
    if force and not (reason or "").strip():
        raise PromotionError(
            '--force needs --reason "...": the reason for overriding the promotion gates is '
            "recorded in the version's provenance and the promotion history"
        )


def stage(
    labels: LabelSet,
    result: CalibrationResult,
    fit: RelevanceFit | None,
    prov: Provenance,
    settings: Settings,
    *,
    target: Path | None = None,
    promote: bool = True,
    force: bool = False,
    reason: str | None = None,
    by: str | None = None,
    quality: LabelQuality | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Staged:
    """Store ``result`` (+ ``fit``) as a candidate version of ``target`` (default: the
    router's thresholds.json), evaluate the gates, and promote it when ``promote`` and the
    gates pass (or ``force``, with ``reason``)."""
    from dataclasses import asdict

    from evaluation.calibration import thresholds_document
    from evaluation.promotion import VersionStore, evaluate_gates, ran_by

    check_force(force, reason)
    store = VersionStore(target or settings.resolved_thresholds_path)
    n_boot = int(result.n_boot) or 1000
    gates = evaluate_gates(
        result,
        fit,
        labels,
        store.in_force(),
        min_per_class=settings.calibration_min_per_class,
        margin=settings.calibration_not_worse_margin,
        n_boot=n_boot,
        seed=result.seed,
    )
    who = by or ran_by()
    filled = prov.filled()
    keep = fit is not None and gates.keep_relevance
    metrics: dict[str, Any] = result.summary()
    if fit is not None:
        metrics["relevance"] = {"kind": fit.kind, "kept": keep, **fit.summary()["held_out"]}
    provenance = {
        **asdict(filled),
        "rows": labels.n,
        "class_counts": {"relevant": result.n_pos, "irrelevant": result.n_neg},
        "ran_by": who,
        "created_at": filled.date,
        "metrics": metrics,
        "gates": gates.to_dict(),
        "label_quality": quality.to_dict() if quality is not None else None,
        **dict(extra or {}),
    }
    version = store.create(
        thresholds_document(result, filled),
        fit.model.to_dict() if (fit is not None and keep) else None,
        provenance,
    )
    promoted = False
    if promote and (gates.passed or force):
        version = store.promote(
            version.id, by=who, reason=reason, forced=force and not gates.passed
        )
        promoted = True
    return Staged(version, gates, promoted, store.thresholds_path)


def append_gates(md: Path, staged: Staged) -> None:
    """Add the promotion section to a calibration report (markdown)."""
    from evaluation.promotion import format_gates

    verdict = (
        f"promoted: `{staged.version.id}` is in force ({staged.in_force_path})"
        if staged.promoted
        else f"NOT PROMOTED: gate(s) failed: {', '.join(staged.gates.failed)}; the calibration "
        "in force is unchanged"
        if staged.gates.failed
        else "stored as a candidate, not promoted"
    )
    lines = ["## Promotion", "", f"Candidate `{staged.version.id}` ({staged.version.path}).", ""]
    lines += [f"- {line.strip()}" for line in format_gates(staged.gates)]
    lines += ["", f"**{verdict}**", ""]
    text = md.read_text(encoding="utf-8")
    head, sep, tail = text.partition("## Plots")
    md.write_text(head + "\n".join(lines) + "\n" + sep + tail, encoding="utf-8")


@dataclass(frozen=True)
class LabelsCalibration:
    result: CalibrationResult
    change: LabelChange
    thresholds_path: Path
    report: Mapping[str, Path]
    relevance: RelevanceFit | None = None
    relevance_path: Path | None = None
    staged: Staged | None = None
    quality: LabelQuality | None = None

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
            **(self.staged.to_dict() if self.staged is not None else {}),
            "relevance": None
            if self.relevance is None
            else {
                "kind": self.relevance.kind,
                "candidate": self.relevance.chosen,
                "features": list(self.relevance.model.features),
                "accept": self.relevance.model.accept,
                "skip": self.relevance.model.skip,
                "held_out": self.relevance.summary()["held_out"],
                "path": str(self.relevance_path) if self.relevance_path else None,
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
    force: bool = False,
    reason: str | None = None,
    by: str | None = None,
    promote: bool = True,
    **calib_kwargs: Any,
) -> LabelsCalibration:
    """Check and validate ``labels_path``, calibrate, store a candidate version of ``out``
    (default: the thresholds the router reads), promote it when the gates pass (or
    ``force`` with ``reason``), and write ``<reports>/<report_name>_report.md``.

    With ``relevance`` the relevance model (``p_relevant``) is fitted on the same labels; the
    candidate keeps it only when it beats raw cosine on held-out queries."""
    from context_core.routing.confidence import ConfidencePolicy, model_name
    from evaluation.calibration import Provenance, calibrate, compare_with_current
    from evaluation.label_quality import load_checked_labels
    from evaluation.relevance_calibration import try_fit_relevance
    from evaluation.report import write_calibration_report

    check_force(force, reason)
    current = ConfidencePolicy.load(settings)  # read before anything changes
    labels, quality = load_checked_labels(labels_path, min_rows=min_rows)
    result = calibrate(labels.scores, labels.labels, **calib_kwargs)
    prov = Provenance(
        model=model_name(model or settings.embed_model),
        collection=collection or settings.collection_main,
        labels_sha256=labels.sha256,
        labels_path=str(labels_path),
    ).filled()
    fit, note = try_fit_relevance(
        labels,
        model=prov.model,
        dataset=Path(labels_path).stem,
        enabled=relevance,
        calib_kwargs=calib_kwargs,
    )
    staged = stage(
        labels, result, fit, prov, settings, target=out, promote=promote, force=force,
        reason=reason, by=by, quality=quality,
    )  # fmt: skip
    version_dir = staged.version.path
    rel_path = version_dir / "relevance_model.json" if staged.version.relevance else None
    if fit is not None and rel_path is None:
        note = note or (
            "Not kept in the candidate: it did not beat raw cosine on held-out queries "
            "(gate p_relevant)."
        )
    change = compare_with_current(result, labels, current.accept, current.skip)
    paths = write_calibration_report(
        result,
        settings.reports_dir,
        provenance=prov,
        change=change,
        name=report_name,
        thresholds_path=version_dir / "thresholds.json",
        relevance=fit,
        relevance_path=rel_path,
        relevance_note=note,
    )
    append_gates(paths["markdown"], staged)
    return LabelsCalibration(
        result=result,
        change=change,
        thresholds_path=staged.in_force_path
        if staged.promoted
        else version_dir / "thresholds.json",
        report=paths,
        relevance=fit,
        relevance_path=rel_path,
        staged=staged,
        quality=quality,
    )
