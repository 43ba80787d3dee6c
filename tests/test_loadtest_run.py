"""Real Locust campaigns (service + Valkey + Locust subprocesses) at tiny rates, and the
campaign's refusals. The runs assert that the artefacts and a consistent verdict appear, not
that this shared machine meets the SLOs (that figure belongs in the campaign report)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from context_core.config import Settings, get_settings
from context_core.errors import ConfigError
from loadtests.campaign import CampaignConfig, run_campaign, validate


@pytest.fixture(scope="module")
def campaign_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("campaign")
    return get_settings(data_dir=tmp / "ctx", reports_dir=tmp / "reports", redis_url=None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "rate_scale"),
    [("short_sessions", 0.005), ("long_sessions", 0.05), ("burst", 0.002)],
)
def test_a_short_campaign_writes_every_artefact_and_a_verdict(
    campaign_settings: Settings, profile: str, rate_scale: float
) -> None:
    cfg = CampaignConfig(
        profile=profile, duration_s=20.0, rate_scale=rate_scale, seed_knowledge=False
    )
    res = run_campaign(cfg, campaign_settings, say=lambda _m: None)
    reports = campaign_settings.reports_dir
    assert res.report == reports / f"loadtest_{profile}.md"
    assert res.locust_exit in (0, 1), res.notes

    stats_csv = Path(f"{res.csv_prefix}_stats.csv").read_text(encoding="utf-8")
    stats = list(csv.DictReader(stats_csv.splitlines()))
    by_name = {r["Name"]: r for r in stats}
    assert int(by_name["/v1/context"]["Request Count"]) > 0
    assert int(by_name["Aggregated"]["Request Count"]) >= 3 * int(
        by_name["/v1/context"]["Request Count"]
    )
    assert Path(f"{res.csv_prefix}_stats_history.csv").stat().st_size > 0
    assert "locust" in res.html.read_text(encoding="utf-8").lower()
    assert res.plot is not None and res.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    doc = json.loads(res.samples.read_text())
    assert len(doc["samples"]) >= 5
    assert doc["plan"]["duration_s"] == pytest.approx(20.0)
    gates = {r["name"]: r for r in doc["verdict"]["results"]}
    assert set(gates) == {
        "expired_keys_growth",
        "l3_search_p99",
        "context_load_failures",
        "error_ratio",
    }
    assert gates["context_load_failures"]["achieved"] == 0
    assert gates["error_ratio"]["achieved"] == 0
    # the verdict is what the gates and Locust's exit code say, and the report says it
    assert res.passed == (doc["verdict"]["passed"] and res.locust_exit == 0)
    assert res.locust_exit == (0 if doc["verdict"]["passed"] else 1)
    md = res.report.read_text(encoding="utf-8")
    assert f"**Verdict: {'PASS' if res.passed else 'FAIL'}**" in md
    assert "| l3_search_p99 | < 100 ms |" in md
    assert "## Target vs achieved rate over time" in md


def test_campaigns_refuse_what_they_must_not_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="never touches a server given with --redis-url"):
        validate(
            CampaignConfig("burst", redis_url="redis://127.0.0.1:6379/0", fault="redis-restart")
        )
    with pytest.raises(ConfigError, match="not on loopback"):
        validate(CampaignConfig("burst", service_url="http://10.1.2.3:8080", keys_file=tmp_path))
    with pytest.raises(ConfigError, match="needs --keys-file"):
        validate(CampaignConfig("burst", service_url="http://127.0.0.1:8080"))
    with pytest.raises(ConfigError, match="allowed: slow-l3, redis-restart"):
        validate(CampaignConfig("burst", fault="meteor"))
    with pytest.raises(ValueError, match="allowed: burst, long_sessions, short_sessions"):
        validate(CampaignConfig("flat"))
