"""Drawing: each function draws one figure's content into a given matplotlib ``Axes``.

Nothing here computes a metric or writes a report; callers pass results in (compute, store and
draw are separate steps). ``save_calibration_plots`` / ``save_cer_plot`` /
``save_health_plots`` create figures with the non-interactive Agg backend and save PNGs.
matplotlib is imported lazily so importing :mod:`evaluation` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from evaluation.calibration import CalibrationResult
    from evaluation.cer import CerReport

__all__ = [
    "plot_cer_over_time",
    "plot_precision_recall_vs_threshold",
    "plot_reliability",
    "plot_roc",
    "plot_score_histograms",
    "plot_series",
    "save_calibration_plots",
    "save_cer_plot",
    "save_health_plots",
    "save_reliability_plot",
]

ACCEPT_COLOR = "#1b7837"
SKIP_COLOR = "#b2182b"


def _figure(width: float = 6.0, height: float = 4.0) -> tuple[Figure, Axes]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)  # not pyplot: no global figure registry
    return fig, fig.add_subplot(1, 1, 1)


def _threshold_lines(ax: Axes, result: CalibrationResult, *, vertical: bool = True) -> None:
    for value, name, color in (
        (result.accept, "accept", ACCEPT_COLOR),
        (result.skip, "skip", SKIP_COLOR),
    ):
        if vertical:
            ax.axvline(value, color=color, ls="--", lw=1.2, label=f"{name} = {value:.3f}")


def plot_roc(ax: Axes, result: CalibrationResult) -> Axes:
    """ROC curve with the accept and skip operating points marked."""
    ax.plot(result.fpr, result.tpr, color="#2166ac", lw=1.8, label=f"ROC (AUC = {result.auc:.3f})")
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls=":")
    for value, name, color, marker in (
        (result.accept, "accept", ACCEPT_COLOR, "o"),
        (result.skip, "skip", SKIP_COLOR, "s"),
    ):
        admitted = result.scores >= value
        tpr = admitted[result.labels == 1].mean()
        fpr = admitted[result.labels == 0].mean()
        ax.scatter([fpr], [tpr], color=color, marker=marker, s=55, zorder=3,
                   label=f"{name} {value:.3f} (TPR {tpr:.2f}, FPR {fpr:.2f})")  # fmt: skip
    ax.set_xlabel("false positive rate (irrelevant hits admitted)")
    ax.set_ylabel("true positive rate (relevant hits admitted)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_title(f"ROC, n = {result.n} ({result.n_pos} relevant)")
    ax.legend(loc="lower right", fontsize=8)
    return ax


def plot_precision_recall_vs_threshold(ax: Axes, result: CalibrationResult) -> Axes:
    """Precision and recall of "admit every hit scoring >= t" as t varies."""
    grid = np.unique(result.scores)
    pr = np.array([result.precision_recall_at(t) for t in grid])
    ax.plot(grid, pr[:, 0], color="#762a83", lw=1.6, label="precision")
    ax.plot(grid, pr[:, 1], color="#e08214", lw=1.6, label="recall")
    _threshold_lines(ax, result)
    ax.set_xlabel("similarity threshold")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1.02)
    ax.set_title("Precision / recall vs threshold")
    ax.legend(loc="lower left", fontsize=8)
    return ax


def plot_score_histograms(ax: Axes, result: CalibrationResult, *, bins: int = 40) -> Axes:
    """Similarity distributions of relevant vs irrelevant hits, thresholds overlaid."""
    edges = np.linspace(float(result.scores.min()), float(result.scores.max()), bins + 1).tolist()
    ax.hist(result.scores[result.labels == 0], bins=edges, alpha=0.6, color="0.55",
            label=f"irrelevant (n={result.n_neg})")  # fmt: skip
    ax.hist(result.scores[result.labels == 1], bins=edges, alpha=0.6, color="#2166ac",
            label=f"relevant (n={result.n_pos})")  # fmt: skip
    _threshold_lines(ax, result)
    ax.set_xlabel("similarity")
    ax.set_ylabel("hits")
    ax.set_title("Score distribution per class")
    ax.legend(fontsize=8)
    return ax


def plot_reliability(
    ax: Axes, curves: Mapping[str, Sequence[Mapping[str, Any]]], *, title: str = ""
) -> Axes:
    """Reliability diagram: per curve, observed share of relevant hits against the mean
    predicted probability of each bin (``evaluation.relevance_calibration.reliability_bins``),
    marker area by bin size; the diagonal is perfect calibration."""
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls=":", label="perfectly calibrated")
    colors = ("#2166ac", "#b2182b", "#1b7837", "#762a83")
    for (name, bins), color in zip(curves.items(), colors, strict=False):
        if not bins:
            continue
        x = [b["mean_p"] for b in bins]
        y = [b["observed"] for b in bins]
        n = np.array([b["n"] for b in bins], dtype=float)
        ax.plot(x, y, color=color, lw=1.6, marker="o", ms=3, label=name)
        ax.scatter(x, y, s=12 + 120 * n / n.max(), color=color, alpha=0.35)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("predicted probability of relevance (bin mean)")
    ax.set_ylabel("observed share of relevant hits")
    ax.set_title(title or "Reliability diagram (held-out queries)")
    ax.legend(loc="upper left", fontsize=8)
    return ax


def plot_cer_over_time(ax: Axes, report: CerReport) -> Axes:
    """CER per intent per day (one line per intent), overall dashed."""
    days = sorted(report.by_day)
    if not days:
        ax.text(0.5, 0.5, "no routed steps in the period", ha="center", va="center")
        return ax
    x = np.arange(len(days))
    intents = sorted({intent for intent, _ in report.by_intent_day})
    for intent in intents:
        ys = [report.by_intent_day[(intent, d)].cer if (intent, d) in report.by_intent_day
              else np.nan for d in days]  # fmt: skip
        ax.plot(x, ys, marker="o", lw=1.4, label=intent)
    ax.plot(x, [report.by_day[d].cer for d in days], color="k", ls="--", lw=1.2, label="all")
    ax.set_xticks(x, days, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("CER")
    ax.set_title("Context effectiveness rate per intent")
    ax.legend(fontsize=7, ncols=2)
    return ax


def plot_series(
    ax: Axes,
    series: Mapping[str, Sequence[tuple[str, float]]],
    *,
    title: str,
    ylabel: str,
) -> Axes:
    """Generic daily trend: ``{name: [(day, value), ...]}`` (used by the health report)."""
    days = sorted({d for points in series.values() for d, _ in points})
    if not days:
        ax.text(0.5, 0.5, "no history yet", ha="center", va="center")
        ax.set_title(title)
        return ax
    pos = {d: i for i, d in enumerate(days)}
    for name, points in series.items():
        pts = sorted(points)
        ax.plot([pos[d] for d, _ in pts], [v for _, v in pts], marker="o", lw=1.4, label=name)
    ax.set_xticks(range(len(days)), days, rotation=30, ha="right", fontsize=7)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return ax


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    return path


def save_calibration_plots(
    result: CalibrationResult, reports_dir: Path, *, prefix: str = "calibration"
) -> dict[str, Path]:
    """ROC, precision/recall vs threshold and per-class histograms as PNGs."""
    out: dict[str, Path] = {}
    for name, draw in (
        ("roc", plot_roc),
        ("precision_recall", plot_precision_recall_vs_threshold),
        ("score_histograms", plot_score_histograms),
    ):
        fig, ax = _figure()
        draw(ax, result)
        out[name] = _save(fig, Path(reports_dir) / f"{prefix}_{name}.png")
    return out


def save_reliability_plot(
    curves: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, *, title: str = ""
) -> Path:
    fig, ax = _figure(5.5, 5.0)
    plot_reliability(ax, curves, title=title)
    return _save(fig, Path(path))


def save_cer_plot(report: CerReport, path: Path) -> Path:
    fig, ax = _figure(7.0, 4.0)
    plot_cer_over_time(ax, report)
    return _save(fig, Path(path))


def save_health_plots(
    panels: Mapping[str, dict[str, Any]], reports_dir: Path, *, prefix: str = "health"
) -> dict[str, Path]:
    """``panels``: name -> kwargs of :func:`plot_series` (series, title, ylabel)."""
    out: dict[str, Path] = {}
    for name, kwargs in panels.items():
        fig, ax = _figure()
        plot_series(ax, **kwargs)
        out[name] = _save(fig, Path(reports_dir) / f"{prefix}_{name}.png")
    return out
