"""Distributed campaigns: Locust's own master + worker processes on this machine.

The real runs mirror ``tests/test_loadtest_run.py``: a tiny rate (20 req/s) that the machine
holds with a wide margin must PASS every gate from the master's summed stats, 3,000 req/s
must FAIL naming the rate gate; both must leave no Locust process behind. The gate arithmetic
for samples the workers did not flush is checked on hand-made samples (no Locust here: it
monkey-patches the interpreter it is imported into).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from context_core.config import Settings, get_settings
from context_core.errors import ConfigError
from loadtests.campaign import CampaignConfig, CampaignResult, _run_locust, run_campaign, validate
from loadtests.slo import GATES, Sample, evaluate, held_samples


@pytest.fixture(scope="module")
def campaign_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("distributed")
    return get_settings(data_dir=tmp / "ctx", reports_dir=tmp / "reports", redis_url=None)


def _failed(res: CampaignResult) -> str:
    rows = [r for r in res.slo.get("results", []) if not r["passed"]]
    return f"failed gates {rows}; notes {res.notes}"


def _locust_children() -> list[str]:
    """Command lines of Locust processes still running under this test process."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if "locust" in cmd and child.status() != psutil.STATUS_ZOMBIE:
                out.append(cmd)
        except psutil.Error:
            continue
    return out


@pytest.mark.slow
def test_two_locust_workers_hold_a_small_rate_and_the_master_gates_on_their_stats(
    campaign_settings: Settings,
) -> None:
    cfg = CampaignConfig(
        profile="short_sessions",
        duration_s=20.0,
        rate_scale=0.02,
        seed_knowledge=False,
        locust_workers=2,
    )
    res = run_campaign(cfg, campaign_settings, say=lambda _m: None)
    assert res.locust_exit == 0, _failed(res)
    assert res.passed, _failed(res)
    assert not _locust_children(), "Locust processes left running"
    run_dir = res.samples.parent
    for i in (0, 1):  # each worker ran with its own log, and wrote no error into it
        log = (run_dir / f"locust-worker-{i}.log").read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in log and "ERROR" not in log, log[-2000:]

    doc = json.loads(res.samples.read_text())
    assert doc["plan"]["locust_workers"] == 2
    held = held_samples([Sample.from_dict(s) for s in doc["samples"]], doc["plan"]["duration_s"])
    assert len(held) >= 4
    # every sample of the held part holds both workers' stats, flushed for that sample
    assert all(s.workers == 2 and s.stats_synced for s in held), held
    gates = {r["name"]: r for r in doc["verdict"]["results"]}
    assert list(gates) == list(GATES)
    assert doc["verdict"]["passed"] and doc["verdict"]["failed"] == []
    assert 0.95 <= gates["achieved_rate"]["achieved"] <= 1.05
    assert gates["request_p99"]["achieved"] < 100
    assert gates["context_p99"]["achieved"] < 50
    assert gates["error_ratio"]["achieved"] == 0
    assert gates["l3_search_p99"]["achieved"] is not None  # read by the master from /metrics
    figures = {r["name"]: r for r in doc["verdict"]["figures"]}
    assert figures["expired_keys_growth"]["achieved"] is not None  # Redis INFO, the master
    # the premature-expiration gate joined both workers' session ledgers on the master
    assert gates["premature_expirations"]["achieved"] == 0
    assert doc["expiry"]["ledgers_from_workers"] == 2
    assert doc["expiry"]["sessions"] > 0 and doc["expiry"]["watched"]
    assert gates["memory_growth"]["achieved"] is not None

    # the workers' final reports reached the master before the verdict: its last sample and
    # its CSV summary count the same requests
    stats_csv = Path(f"{res.csv_prefix}_stats.csv").read_text(encoding="utf-8")
    rows = {r["Name"]: r for r in csv.DictReader(stats_csv.splitlines())}
    assert int(rows["Aggregated"]["Request Count"]) == doc["samples"][-1]["requests"] > 300
    assert int(rows["/v1/context"]["Request Count"]) > 0
    md = res.report.read_text(encoding="utf-8")
    assert "**Verdict: PASS** (Locust exit code 0)" in md
    assert "a Locust master and 2 worker processes" in md


@pytest.mark.slow
def test_ctx_loadtest_workers_2_at_a_rate_this_machine_cannot_hold_exits_1_naming_the_gate(
    tmp_path: Path,
) -> None:
    """The user's command, as a user runs it: ``ctx loadtest ... --workers 2`` (Locust's master
    + 2 workers) at 3,000 req/s of short sessions, several times what 2 shared cores hold."""
    ctx = Path(sys.executable).parent / "ctx"
    env = {
        **os.environ,
        "CTX_DATA_DIR": str(tmp_path / "ctx"),
        "CTX_REPORTS_DIR": str(tmp_path / "reports"),
        "COLUMNS": "200",
    }
    env.pop("CTX_REDIS_URL", None)
    cmd = [str(ctx), "loadtest", "short_sessions", "--duration", "15s", "--rate-scale", "3.0",
           "--no-seed", "--workers", "2", "--service-workers", "2"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not _locust_children(), "Locust processes left running"
    samples = tmp_path / "ctx" / "loadtest" / "loadtest_short_sessions" / "samples.json"
    doc = json.loads(samples.read_text())
    assert doc["plan"]["locust_workers"] == 2
    # Which gate breaks first depends on the machine's load (the rate falls short, or it is held
    # and the latency gates fail): each failed gate is named, on the console and in the report.
    failed = doc["verdict"]["failed"]
    load_gates = {"achieved_rate", "request_p99", "context_p99", "l3_search_p99", "error_ratio"}
    assert load_gates & set(failed), failed
    gates = {r["name"]: r for r in doc["verdict"]["results"]}
    if "achieved_rate" in failed:
        assert gates["achieved_rate"]["achieved"] < 0.95
    md = (tmp_path / "reports" / "loadtest_short_sessions.md").read_text(encoding="utf-8")
    assert "**Verdict: FAIL** (Locust exit code 1)" in md
    for name in failed:
        assert name in proc.stdout and "FAIL" in proc.stdout, proc.stdout[-3000:]
        assert f"- **{name}**:" in md
    assert "a Locust master and 2 worker processes" in md


@pytest.mark.slow
def test_workers_are_stopped_when_the_master_fails(tmp_path: Path) -> None:
    # a "master" that exits at once: the two real workers never hear from it
    notes: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    rc = _run_locust(
        [sys.executable, "-c", "import sys; sys.exit(3)"],
        2,
        tmp_path,
        30.0,
        procs,
        notes,
        lambda _m: None,
    )
    assert rc == 3
    assert len(procs) == 3
    assert all(p.poll() is not None for p in procs)
    assert not _locust_children()
    assert (tmp_path / "locust-worker-1.log").exists()
    assert any("worker" in n for n in notes), notes


def _sample(t: float, requests: int, *, synced: bool = True, target: float = 10.0) -> Sample:
    hist = ((5, requests),)
    return Sample(
        t=t,
        target_rps=target,
        requests=requests,
        target_total=10.0 * t,
        rt_all=hist,
        rt_context=hist,
        expired_keys=0,
        keys=100,
        l3_buckets=((0.05, float(requests)), (float("inf"), float(requests))),
        load_failures=0.0,
        rss_bytes=1e8,
        py_blocks=1e6,
        workers=2,
        stats_synced=synced,
    )


def test_samples_the_workers_did_not_flush_never_end_a_window() -> None:
    # counters of the last in-window sample lag (a worker did not answer the flush): the
    # window ends at the sample before it instead of reading 40 requests short
    rows = [_sample(t, int(10 * t)) for t in (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0)]
    rows.append(_sample(20.0, 160, synced=False))
    held = held_samples(rows, 20.0)
    assert held[-1].t == 18.0
    verdict = evaluate(rows, run_s=20.0)
    rate = next(r for r in verdict.results if r.name == "achieved_rate")
    assert rate.passed and rate.achieved == pytest.approx(1.0)


def test_a_distributed_run_without_flushed_stats_fails_its_gates_and_says_why() -> None:
    rows = [_sample(t, int(10 * t), synced=False) for t in (2.0, 4.0, 6.0, 8.0, 10.0, 20.0)]
    verdict = evaluate(rows, run_s=20.0)
    assert not verdict.passed
    by_name = {r.name: r for r in (*verdict.results, *verdict.figures)}
    for gate in ("achieved_rate", "request_p99", "context_p99", "expired_keys_growth"):
        assert not by_name[gate].passed and by_name[gate].achieved is None
        assert "Locust workers' stats not flushed" in by_name[gate].note, by_name[gate]
    assert {"achieved_rate", "request_p99", "context_p99"} <= set(verdict.failed)


def test_sample_round_trips_with_worker_fields() -> None:
    s = _sample(4.0, 40, synced=False)
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.workers == 2 and back.stats_synced is False
    old = {k: v for k, v in s.to_dict().items() if k not in ("workers", "stats_synced")}
    assert Sample.from_dict(old).stats_synced is True  # samples written before: one process


def test_the_cli_offers_locust_workers_and_the_campaign_refuses_a_negative_count() -> None:
    from context_app.cli import app

    out = CliRunner().invoke(app, ["loadtest", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    assert "--workers" in out.output and "--master-host" in out.output
    assert "--service-workers" in out.output and "--locust-workers" not in out.output
    with pytest.raises(ConfigError, match=r"--workers \(Locust\) must be 0 or more"):
        validate(CampaignConfig("burst", locust_workers=-1))
