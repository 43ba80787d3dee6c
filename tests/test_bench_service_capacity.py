"""benchmarks/service_capacity.py: the mix arithmetic and goal verdicts (fast), and the CPU per
endpoint + floors part against a real service, Valkey and bare ASGI app at a tiny N (slow)."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

# benchmarks/ is a directory of scripts, not an installed package: `python -m pytest` finds it
# through the working directory, the bare `pytest` script does not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import service_capacity as sc
from benchmarks._common import write_section
from context_core.config import get_settings
from loadtests.shapes import plan

# --- fast: pure arithmetic --------------------------------------------------------------------


def test_mix_weights_per_session() -> None:
    assert sc.mix_weights(2, 0.2) == {
        "create": 1.0,
        "plan": 1.0,
        "event": 2.0,
        "context": 2.0,
        "output": 2.0,
        "close": pytest.approx(0.8),
    }
    w = sc.mix_weights(4, 0.0, confirm_every=4)
    assert w["confirmation"] == 1.0 and w["close"] == 1.0 and w["event"] == 4.0
    assert "close" not in sc.mix_weights(2, 1.0)  # every session abandoned: no close
    with pytest.raises(ValueError):
        sc.mix_weights(0)
    with pytest.raises(ValueError):
        sc.mix_weights(2, 1.5)


def test_profile_mix_matches_the_plans_endpoint_split() -> None:
    steps, step_rate, weights = sc.profile_mix()
    p = plan(sc.PROFILE, duration_s=60, rate_scale=1.0)
    assert steps == p.steps_per_session and step_rate > 0
    split = getattr(p, "endpoint_rates", None)
    if split is None:
        pytest.skip("RunPlan.endpoint_rates not in this tree")
    rates = {e: r for e, r in split(1.0).items() if r > 0}
    total = sum(weights.values())
    assert set(rates) == set(weights)
    for e, r in rates.items():
        assert weights[e] / total == pytest.approx(r, rel=1e-9), e


def test_weighted_mean() -> None:
    w = {"a": 1.0, "b": 3.0}
    assert sc.weighted_mean({"a": 2.0, "b": 6.0, "unweighted": 99.0}, w) == pytest.approx(5.0)
    with pytest.raises(KeyError):
        sc.weighted_mean({"a": 1.0}, w)


def test_goal_rows_pass_fail_and_not_run() -> None:
    ok = sc.goal_rows(1600.0, 0.25, 0.1)
    assert [r["value"] for r in ok] == ["PASS", "PASS", "PASS"]
    assert "ratio 2.50x" in ok[1]["detail"]
    bad = sc.goal_rows(640.0, 1.36, 0.026)
    assert [r["value"] for r in bad] == ["FAIL", "FAIL", "FAIL"]
    assert "best held 640 req/s" in bad[0]["detail"]
    assert sc.goal_rows(0.0, 3.0, 1.0)[0]["detail"] == "none held"
    skipped = sc.goal_rows(None, 0.31, 0.1)
    assert [r["value"] for r in skipped] == ["n/a", "FAIL", "PASS"]  # 3.1x is over 3x
    at = sc.goal_rows(1500.0, 0.6, 0.2)  # exactly at every limit
    assert [r["value"] for r in at] == ["PASS", "PASS", "PASS"]
    assert sc.goal_rows(1499.0, 0.61, 0.3)[0]["value"] == "FAIL"  # 1,000 held is not the goal
    assert sc.goal_rows(1499.0, 0.61, 0.3)[2]["value"] == "FAIL"
    assert "1.02x the goal" in sc.goal_rows(None, 0.61, 0.3)[2]["detail"]


def test_find_best_steps_then_bisects() -> None:
    seen: list[float] = []

    def run(rate: float) -> dict[str, Any]:
        seen.append(rate)
        return {
            "rate": rate,
            "held": rate <= 700,
            "achieved_rps": rate,
            "p99_ms": 1,
            "context_p99_ms": 1,
            "wall_s": 0.0,
        }

    best, steps = sc.find_best([600.0, 800.0, 1000.0], 2, run, say=lambda _m: None)
    assert seen == [600.0, 800.0, 700.0, 750.0]
    assert best == 700.0 and len(steps) == 4
    seen.clear()
    best, _ = sc.find_best([600.0], 1, run, say=lambda _m: None)
    assert best == 600.0 and seen == [600.0]  # nothing failed: no bisection


def test_bare_app_answers_a_2kb_json() -> None:
    app = sc.bare_app()
    sent: list[dict[str, Any]] = []
    body = [
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.request", "body": b"1}", "more_body": False},
    ]

    async def receive() -> dict[str, Any]:
        return body.pop(0)

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/x"}, receive, send))
    assert not body  # the whole request body was read
    assert sent[0]["status"] == 200
    payload = sent[1]["body"]
    assert abs(len(payload) - sc.BARE_RESPONSE_BYTES) < 64
    assert json.loads(payload)["fragments"]


def test_per_endpoint_sums_phases_and_the_edge_servers_share() -> None:
    phases = [
        sc.Phase("context:compare_vibration", 10, 0.020, 1.0, 0.002, 1000, 0.004),
        sc.Phase("context:generate_report", 30, 0.040, 1.0, 0.003, 3000, 0.002),
        sc.Phase("event", 20, 0.030, 1.0, 0.001, 500),  # one process: no edge server
    ]
    out = sc.per_endpoint(phases)
    assert out["context"]["n"] == 40
    assert out["context"]["cpu_ms"] == pytest.approx(1.5)
    assert out["context"]["edge_cpu_ms"] == pytest.approx(0.15)
    assert out["context"]["valkey_cpu_ms"] == pytest.approx(0.125)
    assert out["event"]["edge_cpu_ms"] is None
    cpu = _fake_cpu(1.0, 0.1)
    cpu["endpoints"] = out
    details = {r["measure"]: r["detail"] for r in sc.table_rows(cpu, None, None)}
    assert "of which edge server 0.150" in details["service CPU, context (POST /v1/context)"]
    assert "edge server" not in details["service CPU, event (POST /v1/sessions/{id}/events)"]


def test_per_endpoint_counts_redis_round_trips_per_request() -> None:
    phases = [
        sc.Phase("context:compare_vibration", 10, 0.02, 1.0, None, 100, None, 20, 30),
        sc.Phase("context:generate_report", 30, 0.04, 1.0, None, 300, None, 40, 90),
        sc.Phase("event", 20, 0.03, 1.0, None, 500),  # not counted
    ]
    out = sc.per_endpoint(phases)
    assert out["context"]["reads_per_req"] == pytest.approx(1.5)
    assert out["context"]["commands_per_req"] == pytest.approx(3.0)
    assert out["event"]["reads_per_req"] is None
    cpu = _fake_cpu(1.0, 0.1)
    cpu["endpoints"] = out
    details = {r["measure"]: r["detail"] for r in sc.table_rows(cpu, None, None)}
    assert (
        "Redis 1.50 round trips / 3.00 commands per req"
        in details["service CPU, context (POST /v1/context)"]
    )
    assert "round trips" not in details["service CPU, event (POST /v1/sessions/{id}/events)"]


def test_valkey_counts_see_a_pipeline_as_one_round_trip(embedded_valkey_url: str) -> None:
    import redis

    counts = sc.ValkeyCounts(embedded_valkey_url)
    client = redis.Redis.from_url(embedded_valkey_url, max_connections=1)
    try:
        client.ping()  # the connection's own setup is not part of what is counted
        before = counts.read()
        assert counts.read() == before  # its own INFO calls are left out
        pipe = client.pipeline(transaction=False)
        for i in range(5):
            pipe.set(f"bench:counts:{i}", i)
        pipe.execute()
        client.get("bench:counts:0")
        after = counts.read()
        assert (after[0] - before[0], after[1] - before[1]) == (2, 6)
    finally:
        client.close()
        counts.close()


def _fake_cpu(weighted: float, bare: float) -> dict[str, Any]:
    endpoints = {
        e: {"n": 10, "cpu_ms": weighted, "wall_s": 1.0, "bytes": 100, "valkey_cpu_ms": 0.1}
        for e in ("create", "plan", "event", "context", "output", "close")
    }
    phase = sc.Phase("context:compare_vibration", 10, weighted / 100.0, 1.0, 0.001, 1000)
    return {
        "steps": 2,
        "stack": "uvicorn",
        "weights": sc.mix_weights(2, 0.2),
        "endpoints": endpoints,
        "phases": [phase],
        "weighted_cpu_ms": weighted,
        "weighted_valkey_ms": 0.1,
        "idle_ms_per_s": 0.0,
        "bare": {"cpu_ms": bare, "n": 10, "rps": 100.0, "resp_bytes": 2048, "req_bytes": 1024},
        "redis": {"client_cpu_ms": 0.01, "gets_per_s": 5e4, "valkey_cpu_ms": 0.005, "n": 10},
    }


def test_table_and_section_carry_the_goal_rows(tmp_path: Path) -> None:
    steps = [
        {
            "rate": 800.0,
            "held": True,
            "achieved_rps": 799.0,
            "p99_ms": "40",
            "context_p99_ms": "30",
            "failures": 0,
            "gates": ["request_p99 12"],
        },
        {
            "rate": 1000.0,
            "held": False,
            "achieved_rps": 900.0,
            "p99_ms": "300",
            "context_p99_ms": "200",
            "failures": 0,
            "gates": ["request_p99 250 FAIL"],
            "machine_ref_ms": (101.4, 108.9),
        },
    ]
    rows = sc.table_rows(_fake_cpu(1.4, 0.03), steps, 800.0)
    by = {r["measure"]: r for r in rows}
    assert by["GOAL held >= 1,500 req/s"]["value"] == "FAIL"
    assert by["GOAL service CPU/request <= 0.6 CPU-ms"]["value"] == "FAIL"
    assert by["GOAL service CPU/request <= 3x bare ASGI"]["value"] == "FAIL"
    assert by["best held short_sessions rate"]["value"] == 800.0
    body = sc.section_body(rows, step_s=30.0, sessions=10)
    assert "| GOAL held >= 1,500 req/s | FAIL |" in body
    assert "NOT held" in body
    assert "machine reference 101/109 CPU-ms before/after" in body  # the step that had it
    report = tmp_path / "b.md"
    write_section("service", "t", body, report=report)
    assert "GOAL service CPU/request" in report.read_text()
    good = {r["measure"]: r for r in sc.table_rows(_fake_cpu(0.05, 0.03), None, None)}
    assert good["GOAL service CPU/request <= 3x bare ASGI"]["value"] == "PASS"
    assert good["GOAL held >= 1,500 req/s"]["value"] == "n/a"


# --- slow: a real service, Valkey and bare ASGI app -----------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cpu_per_endpoint_and_floors_real(tmp_path: Path) -> None:
    settings = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=None
    )
    cpu = sc.measure_cpu(
        settings,
        sessions=100,
        concurrency=4,
        bare_requests=3000,
        redis_gets=5000,
        warmup_sessions=5,
        say=lambda _m: None,
    )
    assert set(cpu["endpoints"]) == set(sc.ENDPOINTS)
    for e, a in cpu["endpoints"].items():
        assert a["n"] >= 100, e
        assert a["cpu_ms"] > 0, e
    assert cpu["weighted_cpu_ms"] > 0
    assert 0 < cpu["bare"]["cpu_ms"] < cpu["weighted_cpu_ms"]
    assert cpu["redis"]["client_cpu_ms"] > 0 and cpu["redis"]["gets_per_s"] > 0
    rows = sc.table_rows(cpu, None, None)
    body = sc.section_body(rows, step_s=None, sessions=100)
    assert "GOAL service CPU/request <= 3x bare ASGI" in body
    assert "floor: bare ASGI app" in body
    assert cpu["machine_ref_ms"] > 0 and cpu["machine_ref_io_ms"] > 0
    assert "| machine: reference workload (loadtests/machine.py) |" in body
    assert "| machine: system-call reference (loadtests/machine.py) |" in body
    assert math.isfinite(cpu["weighted_cpu_ms"] / cpu["bare"]["cpu_ms"])
