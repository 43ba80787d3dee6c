"""Writing the dense / sparse / hybrid comparison: markdown, JSON and one PNG.

Takes a finished :class:`~evaluation.retrieval_compare.ComparisonRun` (never data to compute
from) and writes ``retrieval_<dataset>.{md,json,png}``; matplotlib is imported lazily and
each plot draws into a given ``Axes``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evaluation.beir import _safe_name
from evaluation.calibration import Interval
from evaluation.retrieval_results import (
    FULL_LOGISTIC,
    HEADLINE_MODE,
    ComparisonRun,
    ConfidenceResult,
    interval_json,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "comparison_document",
    "comparison_markdown",
    "plot_confidence_roc",
    "plot_mode_metrics",
    "plot_reliability",
    "save_comparison_plot",
    "write_comparison_report",
]


def _f(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _ci(v: Interval | None, digits: int = 3) -> str:
    if v is None or math.isnan(v.low):
        return ""
    return f" [{v.low:.{digits}f}–{v.high:.{digits}f}]"


def _pct_ci(v: Interval | None) -> str:
    if v is None or math.isnan(v.low):
        return ""
    return f" [{v.low:.1%}–{v.high:.1%}]"


def _pct(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.1%}"


def comparison_markdown(run: ComparisonRun, png_name: str | None = None) -> str:
    k = run.k
    lines = [
        f"# Retrieval comparison on {run.dataset}: dense vs sparse vs hybrid",
        "",
        f"_{run.date} · model `{run.model}` · {run.n_docs:,} documents ({run.n_chunks:,} "
        f"chunks) · {run.n_queries:,} judged queries · top-{k} · bootstrap {run.n_boot} "
        f"resamples over queries, seed {run.seed}_",
        "",
        "## Retrieval quality (mean over queries, 95 % bootstrap CI)",
        "",
        f"| mode | nDCG@{k} | recall@{k} | MRR@{k} | search p50 ms | search p99 ms |",
        "|---|---|---|---|---:|---:|",
    ]
    for m, r in run.modes.items():
        lines.append(
            f"| {m} | "
            + " | ".join(f"{_f(r.mean[x])}{_ci(r.ci[x])}" for x in ("ndcg", "recall", "mrr"))
            + f" | {_f(r.latency_ms['p50'], 2)} | {_f(r.latency_ms['p99'], 2)} |"
        )
    for m, why in run.skipped_modes.items():
        lines.append(f"| {m} | skipped: {why} | | | | |")
    lines += [
        "",
        "Search latency: one `KnowledgeMemory.search_vector` call per query and mode (query "
        "embedding precomputed, as with the embedding cache; sparse query encoding, fusion and "
        "the cosine of sparse-only hits included), modes timed round-robin on each query.",
        "",
        "## Confidence signal: cosine vs p_relevant (held-out queries only)",
        "",
    ]
    any_conf = next(iter(run.confidence.values()), None)
    if any_conf is not None:
        lines += [
            f"Queries split {run.train_share:.0%} / {1 - run.train_share:.0%} (seed "
            f"{run.seed}): the relevance model and both accept thresholds are fitted on the "
            f"{any_conf.n_train_queries} train queries' top-{k} hits; every figure below is "
            f"on the {any_conf.n_test_queries} held-out queries' hits. AUC intervals resample "
            "held-out queries. The fitting job is the one `calibrate-beir` runs: it picks the "
            "candidate with the lowest out-of-fold Brier score on the train hits (logistic over "
            "every feature, or a cosine-only map); when it picks a cosine-only map, the "
            f"held-out AUC of `{FULL_LOGISTIC}` follows in parentheses, for reference only.",
            "",
            "| mode | held-out hits (relevant) | AUC cosine | AUC p_relevant | Brier p_relevant "
            "| relevance model chosen |",
            "|---|---:|---|---|---:|---|",
        ]
    for m, c in run.confidence.items():
        if c.skipped and not c.auc:
            lines.append(
                f"| {m} | {c.n_test_hits} ({c.n_test_relevant}) | skipped: {c.skipped} | | |"
            )
            continue
        p_auc = (
            f"{_f(c.auc['p_relevant'])}{_ci(c.auc_ci['p_relevant'])}"
            if "p_relevant" in c.auc
            else f"not measured: {c.skipped}"
        )
        if FULL_LOGISTIC in c.auc:
            p_auc += f" ({FULL_LOGISTIC}: {_f(c.auc[FULL_LOGISTIC])}{_ci(c.auc_ci[FULL_LOGISTIC])})"
        lines.append(
            f"| {m} | {c.n_test_hits:,} ({c.n_test_relevant:,}) | "
            f"{_f(c.auc['cosine'])}{_ci(c.auc_ci['cosine'])} | {p_auc} | {_f(c.brier)} | "
            f"{c.model_kind or 'n/a'} |"
        )
    lines += [
        "",
        "## `confident` hits at the operating point (held-out queries)",
        "",
        "Each signal's accept threshold is fitted on the train hits as the calibration jobs "
        "fit it (highest Youden J; for p_relevant on its out-of-fold values, as "
        "`calibrate-beir` writes it into the relevance model); a held-out hit at or above it "
        "would be labelled `confident`. Precision = share of those that are relevant (95 % "
        "CI over queries); recall = share of the relevant hits admitted.",
        "",
        "| mode | signal | accept threshold | precision of confident | recall | hits admitted |",
        "|---|---|---:|---|---:|---:|",
    ]
    for m, c in run.confidence.items():
        for s, o in c.operating.items():
            lines.append(
                f"| {m} | {s} | {_f(o.threshold)} | {_pct(o.precision)}"
                f"{_pct_ci(o.precision_ci)} | {_pct(o.recall)} | {_pct(o.admitted_share)} |"
            )
        if c.precision_at_cosine_recall is not None:
            lines.append(
                f"| {m} | p_relevant at cosine's recall | | "
                f"{_pct(c.precision_at_cosine_recall)} | "
                f"{_pct(c.operating['cosine'].recall)} | |"
            )
    lines += ["", "## Goals (issue 14)", "", "| goal | target | measured | 95 % CI | verdict |",
              "|---|---|---:|---|---|"]  # fmt: skip
    for g in run.goals:
        ci = _ci(g.ci).strip() or "n/a"
        lines.append(
            f"| {g.name} | {g.target} | {_f(g.measured)} | {ci} | **{g.verdict}**"
            + (f" ({g.note})" if g.note else "")
            + " |"
        )
    lines += [
        "",
        "## How it was measured",
        "",
        f"- Documents are cut into chunks of the model's window on token boundaries, each led "
        f"by the title (ingestion's context line), the same text for the dense and the sparse "
        f"vector; a document "
        f"ranks at its best chunk ({run.settings_used.get('chunk_hits_fetched_per_query')} "
        f"chunk hits fetched per query, folded to the top {k} documents).",
        "- Relevant = qrels grade > 0; nDCG uses the grade as gain; unjudged documents count "
        "as irrelevant (the BEIR convention: on sparsely judged sets this makes every mode "
        "look slightly worse, equally).",
        "- Retrieval settings: "
        + ", ".join(f"`{k_}`={v}" for k_, v in run.settings_used.items())
        + ".",
        "- Run time: " + ", ".join(f"{n} {s:.0f} s" for n, s in run.timings_s.items()) + ".",
    ]
    if png_name:
        lines += ["", f"![metrics, ROC and reliability]({png_name})"]
    return "\n".join(lines) + "\n"


def comparison_document(run: ComparisonRun) -> dict[str, Any]:
    return _json_safe(
        {
            "dataset": run.dataset,
            "model": run.model,
            "date": run.date,
            "k": run.k,
            "n_docs": run.n_docs,
            "n_chunks": run.n_chunks,
            "n_queries": run.n_queries,
            "seed": run.seed,
            "n_boot": run.n_boot,
            "train_share": run.train_share,
            "modes": {m: r.summary() for m, r in run.modes.items()},
            "skipped_modes": dict(run.skipped_modes),
            "confidence": {m: c.summary() for m, c in run.confidence.items()},
            "goals": [
                {
                    "name": g.name,
                    "target": g.target,
                    "measured": g.measured,
                    "ci": interval_json(g.ci) if g.ci else None,
                    "verdict": g.verdict,
                    "note": g.note,
                }
                for g in run.goals
            ],
            "settings": dict(run.settings_used),
            "timings_s": dict(run.timings_s),
        }
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, np.floating | np.integer):
        return _json_safe(value.item())
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def plot_mode_metrics(ax: Axes, run: ComparisonRun) -> Axes:
    """Grouped bars: one group per metric, one bar per mode, 95 % CI as error bars."""
    metrics = ("ndcg", "recall", "mrr")
    modes = list(run.modes)
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(metrics))
    for i, m in enumerate(modes):
        r = run.modes[m]
        means = np.array([r.mean[t] for t in metrics])
        lo = np.array([r.ci[t].low for t in metrics])
        hi = np.array([r.ci[t].high for t in metrics])
        err = np.vstack([np.nan_to_num(means - lo), np.nan_to_num(hi - means)])
        ax.bar(x + (i - (len(modes) - 1) / 2) * width, means, width, yerr=err, capsize=3,
               label=m)  # fmt: skip
    ax.set_xticks(x, [f"{t}@{run.k}" for t in metrics])
    ax.set_ylim(0, 1.15)
    ax.set_title(f"{run.dataset}: retrieval quality (95 % CI)")
    ax.legend(fontsize=8, loc="upper center", ncols=len(modes))
    return ax


def plot_confidence_roc(ax: Axes, conf: ConfidenceResult) -> Axes:
    """ROC of each signal on the held-out hits, its accept threshold marked."""
    for s, (fpr, tpr) in conf.roc.items():
        (line,) = ax.plot(fpr, tpr, lw=1.6, label=f"{s} (AUC {conf.auc[s]:.3f})")
        o = conf.operating.get(s)
        if o is not None:
            ax.scatter([o.false_positive_rate], [o.recall], s=40, zorder=3,
                       color=line.get_color(), label=f"{s} accept {o.threshold:.3f}")  # fmt: skip
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls=":")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(f"ROC, {conf.mode} top-k hits, held-out ({conf.n_test_hits} hits)")
    ax.legend(loc="lower right", fontsize=8)
    return ax


def plot_reliability(ax: Axes, conf: ConfidenceResult) -> Axes:
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls=":")
    if conf.reliability is None:
        ax.text(0.5, 0.5, conf.skipped or "no p_relevant", ha="center", va="center", fontsize=7,
                wrap=True)  # fmt: skip
    else:
        mean_p, frac, count = conf.reliability
        ok = count > 0
        ax.plot(mean_p[ok], frac[ok], marker="o", lw=1.4, label="p_relevant")
        for mp, fr, n in zip(mean_p[ok], frac[ok], count[ok], strict=True):
            ax.annotate(str(n), (mp, fr), fontsize=6, xytext=(3, -8), textcoords="offset points")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted p_relevant (bin mean)")
    ax.set_ylabel("observed share relevant")
    brier = f", Brier {conf.brier:.3f}" if conf.brier is not None else ""
    ax.set_title(f"reliability, {conf.mode}, held-out{brier}")
    return ax


def save_comparison_plot(run: ComparisonRun, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4), dpi=100)
    axes = fig.subplots(1, 3)
    plot_mode_metrics(axes[0], run)
    conf = run.confidence.get(HEADLINE_MODE) or next(iter(run.confidence.values()), None)
    if conf is not None:
        plot_confidence_roc(axes[1], conf)
        plot_reliability(axes[2], conf)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_comparison_report(run: ComparisonRun, reports_dir: Path) -> dict[str, Path]:
    """``retrieval_<dataset>.md`` + ``.json`` + ``.png`` in ``reports_dir``."""
    from evaluation.report import write_json, write_text

    stem = f"retrieval_{_safe_name(run.dataset)}"
    png = save_comparison_plot(run, Path(reports_dir) / f"{stem}.png")
    md = write_text(Path(reports_dir) / f"{stem}.md", comparison_markdown(run, png.name))
    js = write_json(Path(reports_dir) / f"{stem}.json", comparison_document(run))
    return {"markdown": md, "json": js, "png": png}
