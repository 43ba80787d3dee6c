"""The campaign report: markdown a person can read, plus a PNG (target vs achieved rate,
latency over time). Reads what Locust and the sampler wrote; computes nothing new."""

from __future__ import annotations

import csv
import datetime as dt
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.faults import FaultCheck

__all__ = ["plot_timeline", "write_report"]


def _f(v: Any, nd: int = 1) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def _stats_rows(csv_prefix: Path) -> list[dict[str, str]]:
    path = Path(f"{csv_prefix}_stats.csv")
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _timeline_rows(samples: Sequence[dict[str, Any]], n: int = 12) -> list[dict[str, Any]]:
    if not samples:
        return []
    step = max(1, len(samples) // n)
    picked = list(samples[::step])
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    return picked


def plot_timeline(samples: Sequence[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Two panels over run time: target vs achieved req/s; p50/p95/p99 latency."""
    if not samples:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.plot(t, [s["target_rps"] for s in samples], label="target req/s", linestyle="--")
    ax1.plot(t, [s["achieved_rps"] for s in samples], label="achieved req/s")
    ax1.set_ylabel("requests / s")
    ax1.legend(loc="best")
    ax1.set_title(title)
    for q in ("p50_ms", "p95_ms", "p99_ms"):
        ax2.plot(t, [s.get(q) if s.get(q) is not None else float("nan") for s in samples], label=q)
    ax2.axhline(100.0, color="grey", linewidth=0.8, linestyle=":", label="100 ms")
    ax2.set_ylabel("latency ms (Locust, last 10 s)")
    ax2.set_xlabel("run time (s)")
    ax2.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(
    path: Path,
    *,
    profile: str,
    fault: str | None,
    samples_doc: dict[str, Any],
    csv_prefix: Path,
    html: Path,
    fault_checks: Sequence[FaultCheck],
    drill: dict[str, Any] | None,
    passed: bool,
    locust_exit: int,
    notes: Sequence[str],
    wall_s: float,
) -> tuple[Path, Path | None]:
    samples = samples_doc.get("samples", [])
    plan = samples_doc.get("plan", {})
    verdict = samples_doc.get("verdict", {})
    title = f"{profile}" + (f" with fault {fault}" if fault else "")
    plot = plot_timeline(samples, path.with_suffix(".png"), f"Load test: {title}")
    L: list[str] = [f"# Load test: {title}", ""]
    L.append(f"**Verdict: {'PASS' if passed else 'FAIL'}** (Locust exit code {locust_exit})")
    L.append("")
    L.append(
        f"_{platform.machine()}, {os.cpu_count()} cores, service + Valkey + Locust on one "
        f"machine; {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; wall time {wall_s:.0f} s_"
    )
    L.append("")
    if plan:
        L.append(
            f"Plan: profile compressed x{plan['time_scale']:g} into {plan['duration_s']:.0f} s, "
            f"rate x{plan['rate_scale']:g}; {plan['steps_per_session']} steps per session, one "
            f"step every {plan['think_s']:.2f} s per user ({plan['user_rps']:.2f} req/s per "
            "user: tool-result event + context load + output per step, plus create/close)."
        )
        L.append("")
    L += [
        "## SLO gates",
        "",
        "| gate | target | achieved | result | note |",
        "|---|---|---|---|---|",
    ]
    expected = set(verdict.get("expected_breaches", []))
    for r in verdict.get("results", []):
        res = "PASS" if r["passed"] else ("breached (expected under fault)"
                                           if r["name"] in expected else "FAIL")  # fmt: skip
        ach = r["achieved"]
        if r["name"] in ("expired_keys_growth", "error_ratio") and ach is not None:
            ach_s = f"{ach:.3%}"
        else:
            ach_s = _f(ach, 2)
        L.append(f"| {r['name']} | {r['target']} | {ach_s} | {res} | {r.get('note', '')} |")
    if not verdict:
        L.append("| - | - | - | no samples | Locust wrote no samples |")
    L.append("")
    if fault:
        L += [f"## Fault drill: {fault}", "", "| check | expected | observed | result |"]
        L.append("|---|---|---|---|")
        for c in fault_checks:
            L.append(
                f"| {c.name} | {c.expected} | {c.observed} | {'PASS' if c.passed else 'FAIL'} |"
            )
        if drill:
            L += ["", "Timeline (seconds since the drill thread started):", ""]
            for e in drill.get("events", []):
                L.append(f"- {e['t']:.2f} s: {e['event']}")
            probes = drill.get("probes", [])
            if probes:
                down = [p for p in probes if not p["redis_up"]]
                up = [p for p in probes if p["redis_up"]]
                L.append(
                    f"- probes while down: {len(down)} (statuses "
                    f"{sorted({p['context'] for p in down})}, slowest "
                    f"{max((p['context_s'] for p in down), default=0) * 1000:.0f} ms); "
                    f"after restart: {len(up)} until recovered"
                )
        L.append("")
    rows = _stats_rows(csv_prefix)
    if rows:
        L += ["## Latency per endpoint (whole run, Locust)", ""]
        L.append("| endpoint | requests | failures | req/s | p50 ms | p95 ms | p99 ms | max ms |")
        L.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            L.append(
                f"| {r['Name']} | {r['Request Count']} | {r['Failure Count']} | "
                f"{float(r['Requests/s']):.1f} | {r['50%']} | {r['95%']} | {r['99%']} | "
                f"{float(r['Max Response Time']):.0f} |"
            )
        L.append("")
    tl = _timeline_rows(samples)
    if tl:
        L += ["## Target vs achieved rate over time", ""]
        L.append(
            "Achieved = requests completed between two samples; latency percentiles are "
            "Locust's trailing 10 s window."
        )
        L.append("")
        L.append("| t (s) | target req/s | achieved req/s | users | p50 ms | p95 ms | p99 ms |")
        L.append("|---|---|---|---|---|---|---|")
        for s in tl:
            L.append(
                f"| {s['t']:.0f} | {s['target_rps']:.1f} | {s['achieved_rps']:.1f} | "
                f"{s['users']} | {_f(s.get('p50_ms'), 0)} | {_f(s.get('p95_ms'), 0)} | "
                f"{_f(s.get('p99_ms'), 0)} |"
            )
        L.append("")
    if plot is not None:
        L += [f"![target vs achieved rate, latency]({plot.name})", ""]
    if notes:
        L += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    L += [
        "## Files",
        "",
        f"- Locust CSV: `{Path(csv_prefix).name}_stats.csv`, `_stats_history.csv`, "
        "`_failures.csv`, `_exceptions.csv`",
        f"- Locust HTML report: `{html.name}`",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L), encoding="utf-8")
    return path, plot
