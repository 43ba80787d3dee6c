"""Real Locust campaigns (service + Valkey + Locust subprocesses) and the campaign's refusals.

The tiny-rate runs are rates this 2-core machine holds with a wide margin, so they must PASS
every gate (exit 0); the overload run asks for 3,000 req/s, several times what the service
holds here, so it must FAIL (exit 1) and name the rate/latency gates that caught it.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from context_core.config import Settings, get_settings
from context_core.errors import ConfigError
from loadtests.campaign import CampaignConfig, CampaignResult, run_campaign, validate
from loadtests.slo import GATES


@pytest.fixture(scope="module")
def campaign_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("campaign")
    return get_settings(data_dir=tmp / "ctx", reports_dir=tmp / "reports", redis_url=None)


def _failed(res: CampaignResult) -> str:
    rows = [r for r in res.slo.get("results", []) if not r["passed"]]
    return f"failed gates {rows}; notes {res.notes}"


def _stats(res: CampaignResult) -> dict[str, dict[str, str]]:
    stats_csv = Path(f"{res.csv_prefix}_stats.csv").read_text(encoding="utf-8")
    return {r["Name"]: r for r in csv.DictReader(stats_csv.splitlines())}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "rate_scale"),
    # 20, 10 and (peak) 30 req/s: a few percent of what the service holds on this machine
    [("short_sessions", 0.02), ("long_sessions", 0.1), ("burst", 0.01)],
)
def test_a_short_campaign_at_a_held_rate_passes_every_gate(
    campaign_settings: Settings, profile: str, rate_scale: float
) -> None:
    cfg = CampaignConfig(
        profile=profile, duration_s=20.0, rate_scale=rate_scale, seed_knowledge=False
    )
    res = run_campaign(cfg, campaign_settings, say=lambda _m: None)
    reports = campaign_settings.reports_dir
    assert res.report == reports / f"loadtest_{profile}.md"
    assert res.locust_exit == 0, _failed(res)
    assert res.passed, _failed(res)

    by_name = _stats(res)
    n_context = int(by_name["/v1/context"]["Request Count"])
    assert n_context > 0
    assert int(by_name["Aggregated"]["Request Count"]) >= 3 * n_context
    creates = int(by_name["/v1/sessions"]["Request Count"])
    closes = int(by_name["/v1/sessions/{id}"]["Request Count"])
    if profile != "burst":  # 40+ and 20+ sessions: some are abandoned (no close)
        assert 0 < closes < creates
    if profile == "long_sessions":  # confirmations feed the hot collection
        assert int(by_name["/v1/sessions/{id}/confirmations"]["Request Count"]) > 0
    assert Path(f"{res.csv_prefix}_stats_history.csv").stat().st_size > 0
    assert "locust" in res.html.read_text(encoding="utf-8").lower()
    assert res.plot is not None and res.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    doc = json.loads(res.samples.read_text())
    assert len(doc["samples"]) >= 5
    plan = doc["plan"]
    assert plan["duration_s"] == pytest.approx(20.0)
    # the service ran with TTLs compressed like its sessions, recorded next to the plan
    assert plan["ttl_factor"] == pytest.approx(plan["profile_session_s"] / plan["run_session_s"])
    assert plan["ttl_factor"] > 10
    ttls = plan["ttls"]
    assert ttls["wm_default_ttl_s"] < 900 and ttls["wm_contract_ttl_s"] < 7200
    assert all(isinstance(ttls[k], int) for k in ("wm_default_ttl_s", "session_idle_s"))
    # the machine's speed around the load, so runs on a shared machine can be compared
    ref = plan["machine_ref_ms"]
    assert ref["before"] > 0 and ref["after"] > 0
    assert res.machine_ref_ms == (ref["before"], ref["after"])
    assert any(n.startswith("machine speed: the reference workload") for n in res.notes)
    last = doc["samples"][-1]
    assert last["rss_bytes"] > 0 and last["py_blocks"] > 0 and last["rt_context"]

    gates = {r["name"]: r for r in doc["verdict"]["results"]}
    assert list(gates) == list(GATES)
    assert doc["verdict"]["passed"] and doc["verdict"]["failed"] == []
    assert gates["achieved_rate"]["achieved"] >= 0.95
    assert gates["request_p99"]["achieved"] < 100
    assert gates["context_p99"]["achieved"] < 50
    assert gates["context_load_failures"]["achieved"] == 0
    assert gates["error_ratio"]["achieved"] == 0
    # the expiry watch saw the step outputs expire (TTLs scaled with the sessions), and
    # none of them while its session still needed it
    assert gates["premature_expirations"]["achieved"] == 0
    expiry = doc["expiry"]
    assert expiry["watched"] and expiry["sessions"] > 0 and expiry["steps"] > 0
    assert expiry["expired"] > 0 and expiry["expected"] > 0 and expiry["premature"] == 0
    assert [f["name"] for f in doc["verdict"]["figures"]] == ["expired_keys_growth"]
    md = res.report.read_text(encoding="utf-8")
    assert "## Expired keys: premature or expected" in md
    assert "Reported, not gated: `expired_keys_growth`" in md
    assert "**Verdict: PASS** (Locust exit code 0)" in md
    assert "**Failed gates:**" not in md
    assert "| l3_search_p99 | < 100 ms |" in md
    assert "## What one request is" in md
    assert "TTLs scaled with the sessions" in md
    assert "## Target vs achieved rate over time" in md
    assert f"took {ref['before']:.0f} CPU-ms before the load" in md


@pytest.mark.slow
def test_ttls_too_short_fail_the_premature_expirations_gate(tmp_path: Path) -> None:
    """The short-ttl drill, as a user runs it: step outputs get 1 s TTLs while a step takes
    3 s (time x2), so they expire before the steps that depend on them; the command must
    exit 1 naming the gate, with the expired keys it caught."""
    ctx = Path(sys.executable).parent / "ctx"
    env = {
        **os.environ,
        "CTX_DATA_DIR": str(tmp_path / "ctx"),
        "CTX_REPORTS_DIR": str(tmp_path / "reports"),
        "COLUMNS": "200",
    }
    env.pop("CTX_REDIS_URL", None)
    cmd = [str(ctx), "loadtest", "burst", "--duration", "30s", "--time-scale", "2",
           "--rate-scale", "0.05", "--fault", "short-ttl", "--no-seed"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "premature_expirations" in proc.stdout and "FAIL" in proc.stdout, proc.stdout[-3000:]
    run = tmp_path / "ctx" / "loadtest" / "loadtest_burst_fault-short-ttl"
    doc = json.loads((run / "samples.json").read_text())
    assert "premature_expirations" in doc["verdict"]["failed"], doc["verdict"]["failed"]
    gates = {r["name"]: r for r in doc["verdict"]["results"]}
    assert gates["premature_expirations"]["achieved"] >= 5
    assert doc["plan"]["ttls"]["wm_min_ttl_s"] == 1
    assert doc["expiry"]["premature"] >= 5 and doc["expiry"]["reasons"]["premature: step"] >= 5
    md = (tmp_path / "reports" / "loadtest_burst_fault-short-ttl.md").read_text(encoding="utf-8")
    assert "**Verdict: FAIL** (Locust exit code 1)" in md
    assert "- **premature_expirations**:" in md
    assert "before step" in md  # an example names the key and the step it was due for


@pytest.mark.slow
def test_a_rate_this_machine_cannot_hold_fails_on_rate_or_latency(
    campaign_settings: Settings,
) -> None:
    # 3,000 req/s of short sessions: several times the service's capacity on 2 shared cores
    cfg = CampaignConfig(
        profile="short_sessions", duration_s=15.0, rate_scale=3.0, seed_knowledge=False
    )
    res = run_campaign(cfg, campaign_settings, say=lambda _m: None)
    assert res.locust_exit == 1, res.notes
    assert res.passed is False
    failed = set(res.slo["failed"])
    assert "achieved_rate" in failed or "request_p99" in failed, failed
    gates = {r["name"]: r for r in res.slo["results"]}
    assert gates["achieved_rate"]["achieved"] < 0.95
    md = res.report.read_text(encoding="utf-8")
    assert "**Verdict: FAIL** (Locust exit code 1)" in md
    assert "**Failed gates:**" in md
    assert "- **achieved_rate**:" in md
    log = (res.samples.parent / "locust.log").read_text(encoding="utf-8", errors="replace")
    assert "failed gates:" in log and "achieved_rate" in log


@pytest.mark.slow
def test_a_two_worker_service_with_an_edge_server_holds_a_small_rate(
    campaign_settings: Settings,
) -> None:
    # two uvicorn workers search one set of Qdrant Edge shards through the edge server;
    # /metrics aggregates both workers (memory gauges included)
    cfg = CampaignConfig(
        profile="short_sessions", duration_s=20.0, rate_scale=0.02, service_workers=2
    )
    res = run_campaign(cfg, campaign_settings, say=lambda _m: None)
    assert res.passed and res.locust_exit == 0, _failed(res)
    run_dir = res.samples.parent
    assert "ready" in (run_dir / "edge_server.log").read_text(encoding="utf-8").lower()
    assert any((run_dir / "metrics").glob("*.db")), "workers wrote no multiprocess metrics"
    doc = json.loads(res.samples.read_text())
    l3 = doc["samples"][-1]["l3_buckets"]
    assert l3 and l3[-1][1] > 0, "no L3 search went through the edge server"
    assert all(s["rss_bytes"] for s in doc["samples"][1:])


def test_campaigns_refuse_what_they_must_not_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="never touches a server given with --redis-url"):
        validate(
            CampaignConfig("burst", redis_url="redis://127.0.0.1:6379/0", fault="redis-restart")
        )
    with pytest.raises(ConfigError, match="not on loopback"):
        validate(CampaignConfig("burst", service_url="http://10.1.2.3:8080", keys_file=tmp_path))
    with pytest.raises(ConfigError, match="needs --keys-file"):
        validate(CampaignConfig("burst", service_url="http://127.0.0.1:8080"))
    with pytest.raises(ConfigError, match="drop --service-url"):
        validate(
            CampaignConfig(
                "burst", service_url="http://127.0.0.1:8080", keys_file=tmp_path, service_workers=2
            )
        )
    with pytest.raises(ConfigError, match="allowed: slow-l3, redis-restart"):
        validate(CampaignConfig("burst", fault="meteor"))
    with pytest.raises(ValueError, match="allowed: burst, long_sessions, short_sessions"):
        validate(CampaignConfig("flat"))
