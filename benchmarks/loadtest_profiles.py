"""Each load profile's best held rate on this machine, and the burst profile's fault drills.

One run, one table (section ``loadtest_profiles`` of ``reports/benchmarks.md``):

1. **Best held rate per profile** (short_sessions, long_sessions, burst). For each, real
   campaigns (:func:`loadtests.campaign.run_campaign`, as ``ctx loadtest`` runs them: a
   Valkey, the service with one worker per CPU, Locust, all on these cores) at rising rate
   scales until one fails its verdict twice in a row. The table gives the best held rate
   (the profile's peak target at that scale), the first rate that failed and the gates there
   (a gate is quoted with the figure it saw), and the premature expirations of every step.
2. **Burst drills at a held rate** (``slow-l3``, ``redis-restart``): the drill's own checks
   and the bundles the service degraded to L1+L2 (``ctx_degraded_bundles_total`` over the
   run).

Each step is short (``--duration``, 30 s by default) and the machine is shared, so the
rates are noisy: a step held in one run may fail in the next. The command that made the
section is written into it.

Run: ``python -m benchmarks.loadtest_profiles`` (about 15 min); ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._common import markdown_table, print_table, write_section

#: Rate scales tried per profile, in order (stepping stops at the first failure).
LADDERS: dict[str, tuple[float, ...]] = {
    "short_sessions": (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
    "long_sessions": (0.25, 0.5, 1.0, 1.5, 2.0, 3.0),
    "burst": (0.025, 0.05, 0.1, 0.15, 0.2, 0.3),
}
DRILLS = ("slow-l3", "redis-restart")


@dataclass
class Step:
    """One campaign of the ladder."""

    scale: float
    peak_rps: float
    passed: bool
    failed: list[str]
    gates: dict[str, Any]
    premature: float | None
    wall_s: float
    expired_growth: float | None = None
    #: the reference workload's CPU-ms before/after the load (loadtests/machine.py): the
    #: machine's speed at that moment (lower is faster)
    machine_ref_ms: tuple[float, float] | None = None


@dataclass
class Ladder:
    profile: str
    steps: list[Step] = field(default_factory=list)

    @property
    def best(self) -> Step | None:
        held = [s for s in self.steps if s.passed]
        return held[-1] if held else None

    @property
    def first_failed(self) -> Step | None:
        """The last attempt at the scale where the climb stopped (None: it never stopped)."""
        last = self.steps[-1] if self.steps else None
        return last if last is not None and not last.passed else None


def peak_rps(profile: str, scale: float, duration_s: float) -> float:
    """The profile's highest target rate at ``scale`` over a run of ``duration_s``."""
    from loadtests.shapes import plan

    rp = plan(profile, duration_s=duration_s, rate_scale=scale)
    n = 400
    return max(rp.target_rps(rp.duration_s * i / n) for i in range(n))


def climb(
    profile: str, scales: Sequence[float], run: Callable[[float], Step], tries: int = 2
) -> Ladder:
    """Run ``scales`` in order until one fails ``tries`` times in a row (pure control flow,
    unit-tested). The machine is shared: a single failure may be another job's burst of
    CPU, so a failed scale is run again before the climb stops there; every attempt is kept
    in ``steps``."""
    ladder = Ladder(profile)
    for scale in scales:
        for _ in range(max(1, tries)):
            step = run(scale)
            ladder.steps.append(step)
            if step.passed:
                break
        else:
            break
    return ladder


def _gate_str(step: Step) -> str:
    parts = []
    for name in step.failed:
        g = step.gates.get(name, {})
        ach = g.get("achieved")
        parts.append(f"{name} ({'-' if ach is None else f'{ach:.3g}'}, {g.get('target', '')})")
    return "; ".join(parts) or "-"


def ladder_rows(ladders: Sequence[Ladder]) -> list[dict[str, Any]]:
    rows = []
    for lad in ladders:
        best, bad = lad.best, lad.first_failed
        rows.append(
            {
                "profile": lad.profile,
                "best held (peak req/s)": "none" if best is None else f"{best.peak_rps:,.0f}",
                "at rate scale": "-" if best is None else f"{best.scale:g}",
                "first failed (peak req/s)": (
                    "not reached" if bad is None else f"{bad.peak_rps:,.0f}"
                ),
                "gates that failed there": "-" if bad is None else _gate_str(bad),
                "premature expirations (all steps)": ", ".join(
                    "-" if s.premature is None else f"{s.premature:.0f}" for s in lad.steps
                ),
            }
        )  # fmt: skip
    return rows


def step_rows(ladders: Sequence[Ladder]) -> list[dict[str, Any]]:
    rows = []
    for lad in ladders:
        for s in lad.steps:
            g = s.gates
            rows.append(
                {
                    "profile": lad.profile,
                    "scale": f"{s.scale:g}",
                    "peak req/s": f"{s.peak_rps:,.0f}",
                    "verdict": "PASS" if s.passed else "FAIL",
                    "achieved": _ach(g, "achieved_rate", "{:.1%}"),
                    "request p99 ms": _ach(g, "request_p99", "{:.0f}"),
                    "context p99 ms": _ach(g, "context_p99", "{:.0f}"),
                    "premature": "-" if s.premature is None else f"{s.premature:.0f}",
                    "expired-keys growth (reported)": "-"
                    if s.expired_growth is None
                    else f"{s.expired_growth:.1%}",
                    "machine ref CPU-ms": "-"
                    if s.machine_ref_ms is None
                    else f"{s.machine_ref_ms[0]:.0f} / {s.machine_ref_ms[1]:.0f}",
                }
            )
    return rows


def _ach(gates: dict[str, Any], name: str, form: str) -> str:
    v = gates.get(name, {}).get("achieved")
    return "-" if v is None else form.format(v)


def _campaign(
    profile: str, scale: float, duration_s: float, fault: str | None, settings: Any
) -> tuple[Any, dict[str, Any]]:
    import json

    from loadtests.campaign import CampaignConfig, auto_workers, run_campaign

    cfg = CampaignConfig(
        profile=profile,
        duration_s=duration_s,
        rate_scale=scale,
        fault=fault,
        service_workers=auto_workers(),
    )
    res = run_campaign(cfg, settings, say=lambda _m: None)
    doc = json.loads(res.samples.read_text()) if res.samples.exists() else {}
    return res, doc


def _step(profile: str, scale: float, duration_s: float, settings: Any) -> Step:
    t0 = time.perf_counter()
    res, _doc = _campaign(profile, scale, duration_s, None, settings)
    gates = {r["name"]: r for r in res.slo.get("results", [])}
    figs = {r["name"]: r for r in res.slo.get("figures", [])}
    failed = list(res.slo.get("failed", []))
    if res.locust_exit not in (0, 1):
        failed.append(f"locust exit {res.locust_exit}")
    step = Step(
        scale=scale,
        peak_rps=peak_rps(profile, scale, duration_s),
        passed=res.passed,
        failed=failed,
        gates=gates,
        premature=gates.get("premature_expirations", {}).get("achieved"),
        wall_s=time.perf_counter() - t0,
        expired_growth=figs.get("expired_keys_growth", {}).get("achieved"),
        machine_ref_ms=res.machine_ref_ms,
    )
    print(
        f"  {profile} x{scale:g} (peak {step.peak_rps:,.0f} req/s): "
        f"{'PASS' if step.passed else 'FAIL ' + _gate_str(step)} [{step.wall_s:.0f} s]",
        flush=True,
    )
    return step


def _drill(scale: float, duration_s: float, fault: str, settings: Any) -> dict[str, Any]:
    from loadtests.campaign import _counter_deltas

    res, doc = _campaign("burst", scale, duration_s, fault, settings)
    degraded, failures = _counter_deltas(doc, "degraded", "load_failures")
    gates = {r["name"]: r for r in res.slo.get("results", [])}
    row = {
        "drill": fault,
        "burst peak req/s": f"{peak_rps('burst', scale, duration_s):,.0f}",
        "verdict": "PASS" if res.passed else "FAIL",
        "drill checks": "; ".join(
            f"{c.name}: {c.observed} ({'ok' if c.passed else 'FAIL'})" for c in res.fault_checks
        ),
        "degraded bundles": "-" if degraded is None else f"{degraded:.0f}",
        "context-load failures": "-" if failures is None else f"{failures:.0f}",
        "premature": _ach(gates, "premature_expirations", "{:.0f}"),
        "gates failed (not expected)": ", ".join(res.slo.get("failed", [])) or "-",
    }
    print(f"  drill {fault}: {row['verdict']} {row['drill checks']}", flush=True)
    return row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loadtest_profiles")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per campaign")
    ap.add_argument("--profiles", default=",".join(LADDERS), help="comma-separated profiles")
    ap.add_argument(
        "--drill-scale",
        type=float,
        default=0.0,
        help="burst rate scale for the drills (0: the burst ladder's best held scale)",
    )
    ap.add_argument(
        "--scales",
        default="",
        help="comma-separated rate scales to climb instead of each profile's ladder",
    )
    ap.add_argument("--no-drills", action="store_true", help="skip the burst fault drills")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)

    from context_core.config import get_settings

    profiles = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in profiles if p not in LADDERS]
    if unknown:
        print(f"unknown profile(s) {unknown}; choose from {', '.join(LADDERS)}", file=sys.stderr)
        return 2
    base = get_settings()
    work = Path(tempfile.mkdtemp(prefix="ctx-bench-lt-"))
    # own reports dir (the campaigns' markdown), the knowledge index kept in the data dir
    settings = base.model_copy(update={"reports_dir": work / "reports"})
    t0 = time.perf_counter()
    given = tuple(float(x) for x in args.scales.split(",") if x)
    ladders = []
    for profile in profiles:
        scales = given or LADDERS[profile]
        print(f"{profile}: stepping {', '.join(f'{s:g}' for s in scales)}", flush=True)
        run = lambda s, p=profile: _step(p, s, args.duration, settings)  # noqa: E731
        ladders.append(climb(profile, scales, run))
    drills: list[dict[str, Any]] = []
    drill_scale = 0.0
    if not args.no_drills:
        burst = next((lad for lad in ladders if lad.profile == "burst"), None)
        drill_scale = args.drill_scale or (
            burst.best.scale if burst and burst.best else LADDERS["burst"][0]
        )
        for fault in DRILLS:
            drills.append(_drill(drill_scale, max(args.duration, 45.0), fault, settings))
    wall = time.perf_counter() - t0

    summary, steps = ladder_rows(ladders), step_rows(ladders)
    print_table("Best held rate per profile", summary)
    print_table("Every step", steps)
    if drills:
        print_table("Burst fault drills", drills)
    if args.no_write:
        return 0
    cmd = "python -m benchmarks.loadtest_profiles" + (" " + shlex.join(argv) if argv else "")
    body = [
        f"Command: `{cmd}` ({wall / 60:.0f} min). Each step is one `ctx loadtest`-style "
        f"campaign of {args.duration:g} s (Valkey, the service with one worker per CPU, "
        "Locust, all on these 2 shared cores); the rate scales rise until a scale fails "
        "its verdict twice in a row (a failure is run once more: the machine is shared). "
        "Rates are the profile's peak target at that scale. **Noisy**: other "
        "jobs share the machine, and a step held here may fail in the next run (and the other "
        "way round); read the first failed rate and its gate as where the margin ends.",
        "",
        markdown_table(summary),
        "Every step (premature expirations: keys that expired while their session still "
        "needed them, the gate that replaced raw expired-keys growth; the growth is still "
        "reported; machine ref: the CPU-ms of `loadtests/machine.py`'s reference workload "
        "before / after the load, about 18-20 on this machine when it is quiet, higher when "
        "other jobs share it):",
        "",
        markdown_table(steps),
    ]
    if drills:
        body += [
            f"Burst fault drills at rate scale {drill_scale:g} (the burst ladder's best held "
            "scale, or its first when none held; the drill's own checks decide, the gates it "
            "breaks on purpose are listed in `loadtests/faults.py`); degraded bundles are "
            "answers the service gave from L1+L2 alone, counted by "
            "`ctx_degraded_bundles_total` over the run:",
            "",
            markdown_table(drills),
        ]
    write_section(
        "loadtest_profiles", "Load profiles: best held rate and burst drills", "\n".join(body)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
