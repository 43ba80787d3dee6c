"""The campaign report: markdown a person can read, plus a PNG (target vs achieved rate,
latency over time). Reads what Locust and the sampler wrote; the only arithmetic is the
plan's own (:mod:`loadtests.shapes`) and the window figures of :mod:`loadtests.slo`."""

from __future__ import annotations

import csv
import datetime as dt
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.faults import FaultCheck
from loadtests.shapes import ENDPOINTS, RunPlan, get_profile
from loadtests.shapes import plan as make_plan
from loadtests.slo import Sample, held_samples, l3_p99_windows

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
    l3 = l3_p99_windows([Sample.from_dict(s) for s in samples])
    if l3:
        ax2.plot(
            [w[0] for w in l3],
            [w[1] if w[1] is not None else float("nan") for w in l3],
            label="L3 search p99 (per window)",
            linestyle="-.",
        )
    ax2.axhline(100.0, color="grey", linewidth=0.8, linestyle=":", label="100 ms")
    ax2.set_ylabel("latency ms (Locust: last 10 s)")
    ax2.set_xlabel("run time (s)")
    ax2.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


PCT_GATES = ("achieved_rate", "error_ratio", "memory_growth")


def _run_plan(profile: str, plan: dict[str, Any]) -> RunPlan | None:
    """The run plan again, from what the locustfile recorded (same inputs, same figures)."""
    try:
        return make_plan(
            get_profile(profile),
            time_scale=float(plan["time_scale"]),
            duration_s=float(plan["duration_s"]),
            rate_scale=float(plan["rate_scale"]),
        )
    except (KeyError, ValueError, TypeError):
        return None


def _held(samples: Sequence[dict[str, Any]], plan: dict[str, Any]) -> list[Sample]:
    rows = [Sample.from_dict(s) for s in samples]
    return held_samples(rows, plan.get("duration_s"))


def _achieved_str(name: str, ach: Any) -> str:
    if ach is None:
        return "-"
    if name in PCT_GATES:
        return f"{ach:.3%}" if name == "error_ratio" else f"{ach:.1%}"
    if name.endswith("_p99"):
        return f"{ach:,.1f} ms"
    return _f(ach, 2)


def _failed_lines(verdict: dict[str, Any]) -> list[str]:
    expected = set(verdict.get("expected_breaches", []))
    out = []
    for r in verdict.get("results", []):
        if not r["passed"] and r["name"] not in expected:
            note = f"; {r['note']}" if r.get("note") else ""
            out.append(
                f"- **{r['name']}**: {_achieved_str(r['name'], r['achieved'])} "
                f"(target {r['target']}{note})"
            )
    return out


def _request_mix(rp: RunPlan, held: Sequence[Sample]) -> list[str]:
    """The "What one request is" section: the agent's sequence, and how the profile's rate
    splits over the endpoints for this run's plan, next to what was measured."""
    prof = rp.profile
    a = prof.abandon_share
    steps = rp.steps_per_session
    peak = max(prof.rate(prof.duration_s * i / 500) for i in range(500))
    L = ["## What one request is", ""]
    L.append(
        "The rate targets count HTTP requests of the agent's sequence "
        "(`loadtests/user.py`), not sessions or steps:"
    )
    L.append("")
    L.append(
        "- **per session**: `POST /v1/sessions` (create) + `PUT /v1/sessions/{id}/plan` (the "
        "step plan, which sets the step outputs' TTLs) + `DELETE /v1/sessions/{id}` (close); "
        f"the close is skipped for the {a:.0%} of sessions the agent abandons (drawn per "
        "session), whose keys must expire through the TTLs and the idle sweep;"
    )
    step_line = (
        "- **per step**: `POST /v1/sessions/{id}/events` (the tool result) + `POST /v1/context` "
        "(the context load: the bundle of at most 3 fragments) + `POST /v1/sessions/{id}/outputs` "
        "(the step output)"
    )
    if prof.confirm_every:
        step_line += (
            f"; every {prof.confirm_every}th step of an agent also posts "
            "`POST /v1/sessions/{id}/confirmations` (a user-confirmed answer to hot knowledge)"
        )
    L += [step_line + ".", ""]
    conf = f" + {rp.confirmations_per_step:g}" if prof.confirm_every else ""
    L.append(
        f"With {steps} steps per session that is 3{conf} + (2 + {1 - a:g} x 1) / {steps} = "
        f"**{rp.requests_per_step:.3f} requests per step**, so a target of R req/s is R / "
        f"{rp.requests_per_step:.3f} steps/s. The profile's peak of {peak:,.0f} req/s splits as "
        "below; the run's target is that x the rate scale "
        f"{rp.rate_scale:g} (mean over the held part), measured over the same held part."
    )
    L.append("")
    at_peak = rp.endpoint_rates(peak)
    run_target = run_done = None
    if len(held) >= 2:
        dt = held[-1].t - held[0].t
        run_target = (held[-1].target_total - held[0].target_total) / dt if dt > 0 else None
        if held[0].endpoints is not None and held[-1].endpoints is not None and dt > 0:
            before = dict(held[0].endpoints)
            run_done = {k: (n - before.get(k, 0)) / dt for k, n in held[-1].endpoints}
    at_run = rp.endpoint_rates(run_target) if run_target else None
    L.append(
        f"| endpoint | requests per session | at {peak:,.0f} req/s | target this run | "
        "measured (held part) |"
    )
    L.append("|---|---|---|---|---|")
    per_session = {
        "create": 1.0,
        "plan": 1.0,
        "event": float(steps),
        "context": float(steps),
        "output": float(steps),
        "confirmation": steps * rp.confirmations_per_step,
        "close": 1.0 - a,
    }
    for key, name in ENDPOINTS.items():
        if key == "confirmation" and not prof.confirm_every:
            continue
        tgt = _f(at_run[key], 2) if at_run else "-"
        got = _f(run_done.get(name, 0.0), 2) if run_done is not None else "-"
        L.append(f"| `{name}` | {per_session[key]:.3g} | {at_peak[key]:,.1f} | {tgt} | {got} |")
    total_got = _f(sum(run_done.values()), 2) if run_done is not None else "-"
    L.append(
        f"| **all** | {rp.requests_per_step * steps:.3g} | {peak:,.1f} | "
        f"{_f(run_target, 2) if run_target else '-'} | {total_got} |"
    )
    L.append("")
    return L


def _expiry_lines(verdict: dict[str, Any], expiry: dict[str, Any] | None) -> list[str]:
    """The premature-expiration gate's evidence and the expired keys reported next to it."""
    L = ["## Expired keys: premature or expected", ""]
    L.append(
        "An expired key is **premature** when its session still needed it: a step output that "
        "expired before the step its plan says depends on it started, any other key of the "
        "session (contract, plan, key index, series, signed state) that expired before the "
        "session's last request, or a read of a step output the session wrote that came back "
        "`context_miss`. Everything else is **expected**: outputs whose dependent step had "
        "started, keys of sessions that had closed or been abandoned, cached tool responses. "
        "Server side, Redis keyspace notifications (`__keyevent@<db>__:expired`, switched on "
        "for the run) give each expired key and when; client side, every Locust user keeps a "
        "ledger of its sessions (when each step started, the last request, how it ended), and "
        "the two are joined at the end (`loadtests/ledger.py`). The gate "
        "`premature_expirations` fails on any."
    )
    L.append("")
    if not expiry:
        return [*L, "No expiry evidence was recorded (see the notes).", ""]
    L += [
        "| expired keys | premature | expected | untracked | lost reads | sessions "
        "(closed / abandoned) | steps |",
        "|---|---|---|---|---|---|---|",
        f"| {expiry['expired']} | {expiry['premature']} | {expiry['expected']} | "
        f"{expiry['untracked']} | {expiry['lost_reads']} | {expiry['sessions']} "
        f"({expiry['closed']} / {expiry['abandoned']}) | {expiry['steps']} |",
        "",
    ]
    for reason, n in expiry.get("reasons", {}).items():
        L.append(f"- {reason}: {n}")
    for ex in expiry.get("examples", []):
        L.append(f"- example: `{ex.split(': ', 1)[0]}`: {ex.split(': ', 1)[-1]}")
    if not expiry.get("watched", True):
        L.append("- Redis expirations were **not watched** (keyspace notifications unavailable)")
    if expiry.get("watch_gaps"):
        L.append(
            f"- the watch lost its connection {expiry['watch_gaps']} time(s) (Redis down); "
            "announcements during a gap are lost"
        )
    predicted = expiry.get("predicted_step_keys_expired")
    if predicted is not None:
        L += [
            "",
            f"Step outputs expired: {expiry['step_keys_expired']}, against "
            f"{predicted} the plan's TTLs predict (each step output lives about "
            f"{expiry.get('step_ttl_s', 0):g} s, the later of `CTX_WM_MIN_TTL_S` and twice the "
            "step period, unless its session closes first; an abandoned session, "
            f"{expiry.get('profile_abandon_share', 0):.0%} of the profile's, keeps them all). "
            "Far more than predicted means TTLs shorter than the plan; far fewer, keys held "
            "longer than they are needed.",
        ]
    for r in verdict.get("figures", []):
        ach = r["achieved"]
        ref = r["target"].removesuffix(" (reference)")
        L.append("")
        L.append(
            f"Reported, not gated: `{r['name']}` "
            f"{'-' if ach is None else f'{ach:.3%}'} (reference {ref}"
            f"; {r.get('note', '')}). It is the expirations of a window over the "
            "keys held in it, so it swings with the load curve: after a burst's peak the keys "
            "held fall while the peak's outputs come due."
        )
    L.append("")
    return L


def _ttl_lines(plan: dict[str, Any]) -> list[str]:
    ttls = plan.get("ttls")
    factor = plan.get("ttl_factor")
    if not ttls:
        return [
            "TTLs: the service's own (not scaled: it was not started by the campaign); the "
            "expired-keys growth is counted per run minute.",
            "",
        ]
    return [
        f"TTLs scaled with the sessions: factor {factor:.4g} = profile session "
        f"{plan.get('profile_session_s', 0):.0f} s / run session "
        f"{plan.get('run_session_s', 0):.2f} s ({plan['steps_per_session']} steps x "
        f"{plan.get('step_period_s', 0):.3f} s); the service ran with "
        + ", ".join(f"`CTX_{k.upper()}={v:g}`" for k, v in ttls.items())
        + " (floors: see `loadtests/shapes.py:scaled_ttls`).",
        "",
    ]


def _drift_lines(all_samples: Sequence[Sample]) -> list[str]:
    windows = [w for w in l3_p99_windows(all_samples) if w[1] is not None]
    if not windows:
        return []
    L = ["## L3 latency drift", ""]
    L.append(
        "L3 search p99 per sampling window (the service's `ctx_l3_search_seconds` buckets, "
        "differences of consecutive samples). Recorded, not gated. Hot points posted = the "
        "confirmations Locust sent successfully so far (each a new hot-knowledge point)."
    )
    L.append("")
    L.append("| window ending t (s) | L3 searches | L3 p99 ms | hot points posted |")
    L.append("|---|---|---|---|")
    by_t = {s.t: s for s in all_samples}
    picked = [windows[0], windows[-1]] if len(windows) > 1 else [windows[0]]
    if len(windows) > 2:
        picked.insert(1, windows[len(windows) // 2])
    for t, p99, n in picked:
        s = by_t.get(t)
        hot = "-"
        if s is not None and s.endpoints is not None:
            hot = str(dict(s.endpoints).get(ENDPOINTS["confirmation"], 0))
        L.append(f"| {t:.0f} | {n:.0f} | {_f(p99, 1)} | {hot} |")
    first, last = windows[0][1], windows[-1][1]
    if first and last:
        L += ["", f"Drift, first to last window: {last - first:+.1f} ms ({last / first - 1:+.0%})."]
    L.append("")
    return L


def _memory_lines(held: Sequence[Sample]) -> list[str]:
    mem = [s for s in held if s.rss_bytes is not None and s.py_blocks is not None]
    if not mem:
        return []
    a, b = mem[0], mem[-1]
    assert a.rss_bytes and b.rss_bytes and a.py_blocks and b.py_blocks
    return [
        "## Service memory (held part)",
        "",
        "| | first held sample | last held sample |",
        "|---|---|---|",
        f"| RSS MB (t = {a.t:.0f} s / {b.t:.0f} s) | {a.rss_bytes / 2**20:,.1f} | "
        f"{b.rss_bytes / 2**20:,.1f} |",
        f"| Python allocated blocks | {a.py_blocks:,.0f} | {b.py_blocks:,.0f} |",
        "",
        "The `memory_growth` gate compares the medians of the first and last thirds.",
        "",
    ]


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
    all_rows = [Sample.from_dict(s) for s in samples]
    held = _held(samples, plan) if plan else []
    L: list[str] = [f"# Load test: {title}", ""]
    L.append(f"**Verdict: {'PASS' if passed else 'FAIL'}** (Locust exit code {locust_exit})")
    L.append("")
    failed = _failed_lines(verdict)
    if failed:
        L += ["**Failed gates:**", "", *failed, ""]
    L.append(
        f"_{platform.machine()}, {os.cpu_count()} cores, service + Valkey + Locust on one "
        f"machine; {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; wall time {wall_s:.0f} s_"
    )
    L.append("")
    if plan:
        L.append(
            f"Plan: profile compressed x{plan['time_scale']:g} into {plan['duration_s']:.0f} s, "
            f"rate x{plan['rate_scale']:g}; {plan['steps_per_session']} steps per session, one "
            f"step every {plan['think_s']:.2f} s per user at most ({plan['user_rps']:.2f} req/s "
            "per user); "
            f"{plan.get('abandon_share', 0):.0%} of sessions abandoned (no close)."
        )
        L.append("")
        if plan.get("locust_workers"):
            L.append(
                f"Load generators: a Locust master and {plan['locust_workers']} worker "
                "processes; the master's stats sum the workers' reports, flushed by every "
                "worker before each sample."
            )
            L.append("")
        L += _ttl_lines(plan)
        if held:
            L.append(
                f"Held part (rate and latency gates): {held[0].t:.1f}-{held[-1].t:.1f} s, after "
                "a warm-up of max(3 s, 10 % of the run), up to the last sample before the "
                "shape stopped."
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
                                           if r["name"] in expected else "**FAIL**")  # fmt: skip
        ach_s = _achieved_str(r["name"], r["achieved"])
        L.append(f"| {r['name']} | {r['target']} | {ach_s} | {res} | {r.get('note', '')} |")
    if not verdict:
        L.append("| - | - | - | no samples | Locust wrote no samples |")
    L.append("")
    L += _expiry_lines(verdict, samples_doc.get("expiry"))
    rp = _run_plan(profile, plan) if plan else None
    if rp is not None:
        L += _request_mix(rp, held)
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
            "Locust's trailing 10 s window. The last three columns count since the start: "
            "bundles served without L3 (`degraded`, the first step of the degradation path), "
            "requests the service shed with 503 + Retry-After (the second), and failures seen "
            "by Locust."
        )
        L.append("")
        L.append(
            "| t (s) | target req/s | achieved req/s | users | p50 ms | p95 ms | p99 ms | "
            "degraded | shed 503 | failed |"
        )
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        base = samples_doc.get("baseline") or {}

        def since(s: dict[str, Any], key: str) -> str:
            v, b = s.get(key), base.get(key) or 0.0
            return "-" if v is None else f"{max(0.0, float(v) - float(b)):,.0f}"

        for s in tl:
            L.append(
                f"| {s['t']:.0f} | {s['target_rps']:.1f} | {s['achieved_rps']:.1f} | "
                f"{s['users']} | {_f(s.get('p50_ms'), 0)} | {_f(s.get('p95_ms'), 0)} | "
                f"{_f(s.get('p99_ms'), 0)} | {since(s, 'degraded')} | {since(s, 'shed')} | "
                f"{s.get('failures', 0):,} |"
            )
        L.append("")
    L += _drift_lines(all_rows)
    L += _memory_lines(held)
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
