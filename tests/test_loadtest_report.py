"""The campaign report from a hand-made samples document (no Locust, no service)."""

from __future__ import annotations

from pathlib import Path

from loadtests.report import write_report
from loadtests.shapes import plan
from loadtests.slo import Sample, evaluate

INF = float("inf")


def _doc() -> dict[str, object]:
    rp = plan("long_sessions", duration_s=20.0, rate_scale=0.1)
    b = [((0.01, 10.0 * i), (0.1, 12.0 * i), (INF, 12.0 * i)) for i in range(4)]
    rows = []
    for i, t in enumerate((2.0, 4.0, 12.0, 20.0)):
        n = int(10 * t)
        rows.append(
            Sample(
                t=t,
                target_rps=10.0,
                target_total=10.0 * t,
                requests=n,
                rt_all=((5, n),),
                rt_context=((4, n // 4),),
                endpoints=(
                    ("POST /v1/context", n // 4),
                    ("POST /v1/sessions/{id}/confirmations", i * 3),
                ),
                l3_buckets=b[i],
                load_failures=0.0,
                expired_keys=0,
                keys=100,
                rss_bytes=500e6,
                py_blocks=1e6,
            )
        )
    verdict = evaluate([*rows[:-1], Sample(t=20.0, requests=150)], run_s=20.0)
    return {
        "samples": [s.to_dict() for s in rows],
        "plan": {
            "time_scale": rp.time_scale,
            "rate_scale": rp.rate_scale,
            "duration_s": rp.duration_s,
            "think_s": rp.think_s,
            "steps_per_session": rp.steps_per_session,
            "user_rps": rp.user_rps,
            "abandon_share": 0.3,
            "profile_session_s": 2820.0,
            "run_session_s": rp.run_session_s,
            "step_period_s": rp.mean_step_period(),
            "ttl_factor": rp.ttl_factor,
            "ttls": {"wm_default_ttl_s": 1, "idle_sweep_interval_s": 1.0},
        },
        "verdict": verdict.to_dict(),
    }


def test_report_names_failed_gates_and_explains_the_request_mix(tmp_path: Path) -> None:
    doc = _doc()
    md_path, plot = write_report(
        tmp_path / "loadtest_long_sessions.md",
        profile="long_sessions",
        fault=None,
        samples_doc=doc,
        csv_prefix=tmp_path / "none",
        html=tmp_path / "none.html",
        fault_checks=[],
        drill=None,
        passed=False,
        locust_exit=1,
        notes=[],
        wall_s=1.0,
    )
    md = md_path.read_text(encoding="utf-8")
    assert plot is not None and plot.exists()
    # the gates that failed are listed before anything else
    head = md.split("## SLO gates")[0]
    assert "**Failed gates:**" in head
    assert "- **memory_growth**:" in head  # no memory reading after the warm-up
    assert "- **achieved_rate**:" not in head  # 10 of 10 req/s held
    assert "## What one request is" in md
    # 2 steps per session: 3 + 0.25 + (2 + 0.7) / 2 = 4.6 requests per step
    assert "**4.600 requests per step**" in md
    assert "| `POST /v1/sessions/{id}/confirmations` | 0.5 | 5.4 |" in md
    assert "| `DELETE /v1/sessions/{id}` | 0.7 | 7.6 |" in md
    assert "| **all** | 9.2 | 100.0 | 10.00 |" in md
    assert "TTLs scaled with the sessions" in md and "`CTX_WM_DEFAULT_TTL_S=1`" in md
    assert "## L3 latency drift" in md
