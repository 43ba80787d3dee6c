"""Report writing: markdown + PNG + JSON from already-computed results.

Writers take results (never raw data to compute from), draw through :mod:`evaluation.plots`
and write files atomically into ``reports_dir``. Markdown links the PNGs by relative path so
the folder can be moved or published as is.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.fsutil import atomic_write_text
from context_core.routing.confidence import label_score
from evaluation.calibration import CalibrationResult, LabelChange, Provenance
from evaluation.health_history import expiry_rate, previous_record

if TYPE_CHECKING:
    from evaluation.cer import CerReport
    from evaluation.health_history import HealthSnapshot
    from evaluation.relevance_calibration import RelevanceFit

__all__ = [
    "cer_markdown",
    "relevance_markdown",
    "write_calibration_report",
    "write_cer_report",
    "write_health_report",
    "write_json",
    "write_text",
]

CRITERIA_TEXT = {
    "youden": "highest Youden J = TPR - FPR on the ROC curve (ties: highest threshold)",
    "precision": "lowest threshold whose precision reaches {target_precision:.0%}",
    "recall": "highest threshold keeping at least {target_recall:.0%} of relevant hits above it",
}


def write_text(path: Path, text: str) -> Path:
    return atomic_write_text(path, text)


def write_json(path: Path, doc: Any) -> Path:
    return write_text(path, json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")


def _f(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.1%}"


def _band_shares(result: CalibrationResult) -> dict[str, dict[str, float]]:
    counts: dict[str, dict[str, float]] = {}
    for cls_name, cls in (("relevant", 1), ("irrelevant", 0)):
        scores = result.scores[result.labels == cls]
        labels = [label_score(float(s), result.accept, result.skip) for s in scores]
        counts[cls_name] = {
            b: (labels.count(b) / len(labels) if labels else float("nan"))
            for b in ("confident", "low_confidence", "below_skip")
        }
    return counts


def write_calibration_report(
    result: CalibrationResult,
    reports_dir: Path,
    *,
    provenance: Provenance,
    change: LabelChange | None = None,
    name: str = "calibration",
    title: str = "Threshold calibration",
    thresholds_path: Path | None = None,
    relevance: RelevanceFit | None = None,
    relevance_path: Path | None = None,
    relevance_note: str = "",
) -> dict[str, Path]:
    """Write ``<name>_report.md``, ``<name>_report.json`` and three PNGs (four with a
    relevance fit: its reliability diagram); return their paths."""
    from evaluation.plots import save_calibration_plots, save_reliability_plot

    reports_dir = Path(reports_dir)
    prov = provenance.filled()
    pngs = save_calibration_plots(result, reports_dir, prefix=name)
    if relevance is not None:
        rel = relevance.summary()["reliability"]
        pngs["reliability"] = save_reliability_plot(
            {
                f"p_relevant ({relevance.chosen})": rel["p_relevant"],
                f"cosine as probability ({relevance.cosine_baseline})": rel["cosine"],
            },
            reports_dir / f"{name}_reliability.png",
        )
    p_acc, r_acc = result.precision_recall_at(result.accept)
    p_skip, r_skip = result.precision_recall_at(result.skip)
    bands = _band_shares(result)
    ci = result.ci
    fmt = {"target_precision": result.target_precision, "target_recall": result.target_recall}

    lines = [
        f"# {title}",
        "",
        f"_{prov.date} · model `{prov.model}` · collection `{prov.collection}` · "
        f"labels `{prov.labels_path}` (sha256 `{prov.labels_sha256[:12]}…`) · "
        f"context-platform {prov.tool_version}_",
        "",
        f"| | value | {ci['auc'].level:.0%} bootstrap CI |",
        "|---|---:|---:|",
        f"| **accept** | **{_f(result.accept)}** | {_f(ci['accept'].low)} – "
        f"{_f(ci['accept'].high)} |",
        f"| **skip** | **{_f(result.skip)}** | {_f(ci['skip'].low)} – {_f(ci['skip'].high)} |",
        f"| ROC AUC | {_f(result.auc)} | {_f(ci['auc'].low)} – {_f(ci['auc'].high)} |",
        "",
        f"{result.n} labelled hits: {result.n_pos} relevant, {result.n_neg} irrelevant; "
        f"bootstrap {result.n_boot} resamples, seed {result.seed}.",
        "",
        "## How the thresholds were chosen",
        "",
        f"- **accept** (`{result.accept_criterion}`): "
        + CRITERIA_TEXT[result.accept_criterion].format(**fmt)
        + f". At it: precision {_pct(p_acc)}, recall {_pct(r_acc)}.",
        f"- **skip** (`{result.skip_criterion}`): "
        + CRITERIA_TEXT[result.skip_criterion].format(**fmt)
        + f". At it: precision {_pct(p_skip)}, recall {_pct(r_skip)}.",
        "- skip is never above accept: if the skip criterion lands above accept, skip is "
        "lowered to accept (recall can only rise), leaving no low-confidence band.",
    ]
    lines += [f"- adjustment: {a}" for a in result.adjustments]
    lines += [
        "",
        "## What the router will do with these hits",
        "",
        "| class | confident | low confidence | below skip |",
        "|---|---:|---:|---:|",
    ]
    for cls_name, shares in bands.items():
        lines.append(
            f"| {cls_name} | {_pct(shares['confident'])} | {_pct(shares['low_confidence'])} "
            f"| {_pct(shares['below_skip'])} |"
        )
    if change is not None:
        lines += [
            "",
            f"## Compared with the thresholds in force (accept {_f(change.current_accept)}, "
            f"skip {_f(change.current_skip)})",
            "",
            f"{_pct(change.changed_share)} of hits would change label "
            f"(relevant {_pct(change.changed_share_relevant)}, "
            f"irrelevant {_pct(change.changed_share_irrelevant)}).",
            "",
        ]
        if change.transitions:
            lines += ["| change | hits |", "|---|---:|"]
            lines += [f"| {k} | {v} |" for k, v in change.transitions.items()]
    if thresholds_path is not None:
        lines += ["", f"Thresholds written to `{thresholds_path}`."]
    if relevance is not None:
        lines += ["", *relevance_markdown(relevance, path=relevance_path)]
    elif relevance_note:
        lines += ["", "## Calibrated relevance probability (p_relevant)", "", relevance_note]
    lines += [
        "",
        "## Plots",
        "",
        f"![ROC]({pngs['roc'].name})",
        "",
        f"![precision and recall vs threshold]({pngs['precision_recall'].name})",
        "",
        f"![score histograms]({pngs['score_histograms'].name})",
        "",
    ]
    if "reliability" in pngs:
        lines += [f"![reliability diagram]({pngs['reliability'].name})", ""]
    md = write_text(reports_dir / f"{name}_report.md", "\n".join(lines))
    doc = result.summary()
    doc["provenance"] = asdict(prov)
    doc["operating_points"] = {
        "accept": {"precision": p_acc, "recall": r_acc},
        "skip": {"precision": p_skip, "recall": r_skip},
    }
    doc["bands"] = bands
    if change is not None:
        doc["change_vs_current"] = asdict(change)
    if relevance is not None:
        doc["relevance"] = {**relevance.summary(), "path": str(relevance_path or "")}
    elif relevance_note:
        doc["relevance"] = {"note": relevance_note}
    js = write_json(reports_dir / f"{name}_report.json", _json_safe(doc))
    return {"markdown": md, "json": js, **pngs}


def relevance_markdown(fit: RelevanceFit, *, path: Path | None = None) -> list[str]:
    """The report section on ``p_relevant``: the model chosen, held-out AUC and Brier score
    against the cosine, its cut points and what they do to each class."""
    s = fit.summary()
    held = s["held_out"]
    t = fit.thresholds
    p_acc, r_acc = t.precision_recall_at(t.accept)
    p_skip, r_skip = t.precision_recall_at(t.skip)
    lines = [
        "## Calibrated relevance probability (p_relevant)",
        "",
        f"Model **{fit.chosen}** over {', '.join(fit.model.features)}, chosen by the lowest "
        f"held-out Brier score ({s['folds']} folds by query: every figure below is on queries "
        "the model was not fitted on).",
    ]
    if fit.missing:
        lines.append(f"The labels hold no {', '.join(fit.missing)}: those features are not used.")
    dropped = fit.model.provenance.get("dropped_constant") or []
    if dropped:
        lines.append(f"Constant in these labels, left out: {', '.join(dropped)}.")
    lines += [
        "",
        "| signal | AUC | Brier | log loss |",
        "|---|---:|---:|---:|",
        f"| cosine (raw) | {_f(held['auc_cosine'])} | – | – |",
    ]
    names = {
        "logistic": "p_relevant (logistic, all features)",
        "logistic_cosine": "cosine as probability (logistic / Platt)",
        "isotonic": "cosine as probability (isotonic)",
    }
    for cand, m in s["selection"].items():
        what = names.get(cand, cand)
        mark = " ← chosen" if cand == fit.chosen else ""
        lines.append(
            f"| {what}{mark} | {_f(m['auc'])} | {_f(m['brier'], 4)} | {_f(m['log_loss'], 4)} |"
        )
    fmt = {"target_precision": t.target_precision, "target_recall": t.target_recall}
    lines += [
        "",
        f"Cut points on p_relevant (same criteria as the cosine thresholds, on the held-out "
        f"probabilities): **accept p >= {_f(t.accept)}** "
        f"({CRITERIA_TEXT[t.accept_criterion].format(**fmt)}; precision {_pct(p_acc)}, "
        f"recall {_pct(r_acc)}), **skip p >= {_f(t.skip)}** (precision {_pct(p_skip)}, "
        f"recall {_pct(r_skip)}); AUC {_f(t.auc)} "
        f"({t.ci['auc'].level:.0%} CI {_f(t.ci['auc'].low)} – {_f(t.ci['auc'].high)}).",
        "",
        "| class | confident | low confidence | below skip |",
        "|---|---:|---:|---:|",
    ]
    for cls_name, shares in _band_shares(t).items():
        lines.append(
            f"| {cls_name} | {_pct(shares['confident'])} | {_pct(shares['low_confidence'])} "
            f"| {_pct(shares['below_skip'])} |"
        )
    if path is not None:
        lines += [
            "",
            f"Model written to `{path}`; the router labels L3 hits by p_relevant when it is the "
            "`relevance_model.json` next to the thresholds it reads.",
        ]
    return lines


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def cer_markdown(
    report: CerReport, *, accept: float, png_name: str | None, top: int = 10
) -> list[str]:
    """The CER section shared by the CER report and the health report."""
    o = report.overall
    lines = [
        f"Steps routed: {o.n_steps}; context loaded: {o.n_loaded}; used: {o.n_used}; "
        f"**CER {_pct(o.cer if o.n_steps else None)}** (accept threshold {accept:.3f}).",
        "",
    ]
    if o.n_not_checkable:
        lines += [
            f"{o.n_not_checkable} step(s) had nothing citable in their context (`not_checkable`); "
            "they count as not used.",
            "",
        ]
    if report.week_over_week:
        lines += ["| ISO week | steps | CER | change vs previous week |", "|---|---:|---:|---:|"]
        for w in report.week_over_week:
            change = "–" if w.change is None else f"{w.change * 100:+.1f} pp"
            lines.append(
                f"| {w.week} | {report.by_week[w.week].n_steps} | {_pct(w.cer)} | {change} |"
            )
        lines.append("")
    if report.by_intent:
        lines += ["| intent | steps | loaded | used | CER |", "|---|---:|---:|---:|---:|"]
        for intent, r in report.by_intent.items():
            lines.append(f"| {intent} | {r.n_steps} | {r.n_loaded} | {r.n_used} | {_pct(r.cer)} |")
        lines.append("")
    if len(report.by_version) > 1 or any(report.by_version):
        lines += [
            "| calibration version | steps | loaded | used | CER |",
            "|---|---:|---:|---:|---:|",
        ]
        for version, r in report.by_version.items():
            lines.append(
                f"| {version or 'unversioned'} | {r.n_steps} | {r.n_loaded} | {r.n_used} "
                f"| {_pct(r.cer)} |"
            )
        lines.append("")
    if report.failure_reasons:
        lines.append(
            "Why steps failed: "
            + ", ".join(f"`{k}` × {v}" for k, v in report.failure_reasons.items())
            + "."
        )
        lines.append("")
        lines += ["| trace | intent | step | reasons |", "|---|---|---:|---|"]
        for v in report.failures[:top]:
            reasons = "; ".join(v.reasons).replace("|", "\\|")
            lines.append(f"| `{v.trace_id[:12]}` | {v.intent} | {v.step} | {reasons} |")
        lines.append("")
    if report.info_notes:
        lines.append(
            "Info, not failures: "
            + ", ".join(f"`{k}` × {v}" for k, v in report.info_notes.items())
            + " (keys an intent asks for opportunistically; only required keys must load)."
        )
        lines.append("")
    if png_name:
        lines += [f"![CER per intent]({png_name})", ""]
    return lines


def write_cer_report(report: CerReport, reports_dir: Path, *, accept: float) -> dict[str, Path]:
    """``cer_report.md`` + ``cer_report.json`` + ``cer_per_intent.png``."""
    from evaluation.plots import save_cer_plot

    reports_dir = Path(reports_dir)
    png = save_cer_plot(report, reports_dir / "cer_per_intent.png")
    lines = ["# Context effectiveness rate", ""]
    lines += cer_markdown(report, accept=accept, png_name=png.name)
    md = write_text(reports_dir / "cer_report.md", "\n".join(lines))
    doc = report.to_dict()
    doc["accept"] = accept
    js = write_json(reports_dir / "cer_report.json", _json_safe(doc))
    return {"markdown": md, "json": js, "png": png}


def _growth(history: list[dict[str, Any]], day: str, section: str, key: str) -> str:
    prev = previous_record(history, day)
    cur = next((r for r in history if r.get("day") == day), {})
    if not prev or key not in prev.get(section, {}) or key not in cur.get(section, {}):
        return "first run"
    delta = cur[section][key] - prev[section][key]
    return f"{delta:+d} since {prev['day']}"


def _series(history: list[dict[str, Any]], section: str, key: str) -> list[tuple[str, float]]:
    return [(r["day"], float(r[section][key])) for r in history if key in r.get(section, {})]


def write_health_report(
    snap: HealthSnapshot,
    history: list[dict[str, Any]],
    reports_dir: Path,
    *,
    policy_source: str = "",
) -> dict[str, Path]:
    """``context_health_report.md`` + ``.json`` + trend PNGs (``health_*.png``)."""
    from evaluation.plots import save_cer_plot, save_health_plots

    reports_dir = Path(reports_dir)
    collections = sorted({c for r in history for c in r.get("l3", {})})
    panels = {
        "l1_memory": {
            "series": {"bytes per state": _series(history, "l1", "bytes_per_instance")},
            "title": "L1 memory per session state", "ylabel": "bytes",
        },
        "l2_keys": {
            "series": {"wm:* keys": _series(history, "l2", "wm_keys")},
            "title": "L2 working-memory keys", "ylabel": "keys",
        },
        "l3_points": {
            "series": {c: _series(history, "l3", c) for c in collections},
            "title": "L3 points per collection", "ylabel": "points",
        },
    }  # fmt: skip
    pngs = save_health_plots(panels, reports_dir)
    if snap.cer is not None:
        pngs["cer"] = save_cer_plot(snap.cer, reports_dir / "health_cer_per_intent.png")

    lines = [f"# Context health report, {snap.day}", "", f"_taken {snap.taken_at}_", ""]
    l1, l2, l3 = snap.l1, snap.l2, snap.l3
    ok, bad = "✅", "❌"
    lines += ["| layer | figure | value | |", "|---|---|---:|---|"]
    if l1:
        lines.append(
            f"| L1 | memory per session state ({l1.trace_pairs} trace pairs) | "
            f"{l1.bytes_per_instance:,.0f} B (object alone {l1.getsizeof_bytes} B) | |"
        )
        lines.append(
            f"| L1 | immutability violations ({l1.mutation_attempts} attempts) | "
            f"{l1.violations} | {ok if l1.violations == 0 else bad} |"
        )
    if l2:
        delta, rate = expiry_rate(l2, snap.taken_at, previous_record(history, snap.day))
        approx = "" if l2.wm_keys_exact else " (SCAN budget reached: lower bound)"
        lines.append(f"| L2 | `wm:*` keys{approx} / DBSIZE | {l2.wm_keys:,} / {l2.dbsize:,} | |")
        rate_txt = (
            "first run or server restarted"
            if delta is None
            else (f"{delta:,} expired" + (f", {rate:,.1f}/h" if rate is not None else ""))
        )
        lines.append(f"| L2 | expiries since previous run | {rate_txt} | |")
    if l3 and not l3.points:
        lines.append("| L3 | collections | none created yet | |")
    if l3:
        for name, count in l3.points.items():
            lines.append(
                f"| L3 | `{name}` points ({l3.models[name]}) | {count:,} | "
                f"{_growth(history, snap.day, 'l3', name)} |"
            )
    ing = snap.ingest
    if ing is not None:
        last = (
            f"{ing.last_run_quarantined} in run `{ing.last_run_id}`"
            if ing.last_run_id
            else "no refresh run recorded"
        )
        lines.append(
            f"| ingest | quarantined pages in the period / last run | {ing.quarantined:,} / "
            f"{last} | {ing.warnings:,} warnings |"
        )
    if snap.cer is not None and snap.cer.overall.n_steps:
        wow = snap.cer.week_over_week[-1]
        change = (
            "no earlier week in the period"
            if wow.change is None
            else f"{wow.change * 100:+.1f} pp week over week"
        )
        lines.append(
            f"| router | CER ({snap.cer.overall.n_steps} steps) | "
            f"{_pct(snap.cer.overall.cer)} | {change} |"
        )
    lines.append("")
    if l1 and l1.violation_details:
        lines += ["**Immutability violations:** " + ", ".join(l1.violation_details), ""]
    if l2 and l2.hot_patterns:
        lines += [
            f"## L2 hot key patterns (SCAN sample of {l2.sampled} keys)",
            "",
            "| pattern | keys in sample | mean idle s |",
            "|---|---:|---:|",
        ]
        lines += [f"| `{p}` | {c} | {_f(i, 1)} |" for p, c, i in l2.hot_patterns]
        lines.append("")
    if ing is not None and ing.top_reasons:
        lines += ["## Quarantine reasons in the period", "", "| reason | pages |", "|---|---:|"]
        lines += [f"| {r.replace('|', '/')} | {n:,} |" for r, n in ing.top_reasons]
        lines.append("")
    lines += ["## Lowest-confidence L3 queries", ""]
    if snap.low_confidence:
        lines += ["| when | intent | query | best score |", "|---|---|---|---:|"]
        for q in snap.low_confidence:
            query = q.query.replace("|", "\\|")[:120]
            lines.append(f"| {q.ts[:16]} | {q.intent} | {query} | {_f(q.best_score)} |")
    else:
        lines.append("No L3 queries traced in the period.")
    lines += ["", "## Context effectiveness rate", ""]
    if snap.cer is not None:
        png = pngs.get("cer")
        lines += cer_markdown(snap.cer, accept=snap.accept, png_name=png.name if png else None)
    else:
        lines += ["No routed steps traced in the period.", ""]
    if policy_source:
        lines += [f"Thresholds in force: accept {snap.accept:.3f} from {policy_source}.", ""]
    lines += ["## Trends", ""]
    lines += [f"![{n}]({pngs[n].name})" + "\n" for n in ("l1_memory", "l2_keys", "l3_points")]
    if snap.errors:
        lines += ["## Sections not collected", ""]
        lines += [f"- {k}: {v}" for k, v in snap.errors.items()]
        lines.append("")
    md = write_text(reports_dir / "context_health_report.md", "\n".join(lines))
    doc = {
        "day": snap.day, "taken_at": snap.taken_at, "accept": snap.accept,
        "l1": asdict(l1) if l1 else None, "l2": asdict(l2) if l2 else None,
        "l3": asdict(l3) if l3 else None,
        "low_confidence": [asdict(q) for q in snap.low_confidence],
        "cer": snap.cer.to_dict() if snap.cer else None, "errors": dict(snap.errors),
        "ingest": asdict(snap.ingest) if snap.ingest else None,
        "history": history,
    }  # fmt: skip
    js = write_json(reports_dir / "context_health_report.json", _json_safe(doc))
    return {"markdown": md, "json": js, **pngs}
