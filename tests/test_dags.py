"""Airflow DAGs: integrity of every file in dags/ and real ``dag.test()`` runs of ours.

Each run happens in a subprocess with a private AIRFLOW_HOME (see the ``airflow_home``
fixture): Airflow freezes its configuration at import time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import AirflowHome


@pytest.fixture(scope="module")
def parsed(airflow_home: AirflowHome) -> dict:
    return airflow_home.run()


def test_dagbag_has_no_import_errors(parsed: dict) -> None:
    assert parsed["import_errors"] == {}
    assert {"knowledge_refresh", "hot_knowledge_merge"} <= set(parsed["dags"])


def test_every_dag_has_tags_retries_and_schedule(parsed: dict) -> None:
    for dag_id, info in parsed["dags"].items():
        assert info["tags"], f"{dag_id} has no tags"
        assert info["schedule"], f"{dag_id} has no schedule"
        assert info["retries"], f"{dag_id} has no tasks"
        low = {t: r for t, r in info["retries"].items() if r < 1}
        assert not low, f"{dag_id}: tasks without retries: {low}"
        assert info["catchup"] is False, f"{dag_id} should not backfill"
        assert info["has_doc_md"], f"{dag_id} has no doc_md"


def test_our_schedules(parsed: dict) -> None:
    assert "0 2 * * 0" in parsed["dags"]["knowledge_refresh"]["schedule"]
    assert "0 3 * * *" in parsed["dags"]["hot_knowledge_merge"]["schedule"]
    assert "30 3 * * *" in parsed["dags"]["data_retention"]["schedule"]


@pytest.mark.slow
def test_data_retention_runs_end_to_end(
    airflow_home: AirflowHome, tmp_path: Path, redis_url: str
) -> None:
    """The DAG enforces an org's retention and writes its receipt to the audit log: a fresh
    preference stays (1-day retention), nothing is deleted twice."""
    import uuid

    from conftest import cleanup_keys

    from context_core.config import get_settings
    from context_core.platform import build_platform

    org = f"dag-ret-{uuid.uuid4().hex[:8]}"
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"ret-agent": {"key_sha256": "0" * 64, "org": org}}))
    cfg = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=redis_url
    )
    try:
        with build_platform(cfg, with_knowledge=False) as p:
            p.compliance.put(org, {"data_retention_policy": 1}, expected_version=0, operator="t")
            p.wm.preferences(org, "u-1").set("units", "metric")
        out = airflow_home.run(
            "data_retention",
            extra_env={
                "CTX_DATA_DIR": str(cfg.data_dir),
                "CTX_REPORTS_DIR": str(cfg.reports_dir),
                "CTX_REDIS_URL": redis_url,
                "CTX_API_KEYS_FILE": str(keys),
            },
        )
        assert out["run"]["state"] == "success", out["run"]
        audit = (cfg.data_dir / "audit" / "audit.jsonl").read_text().splitlines()
        (receipt,) = [json.loads(x) for x in audit if '"kind":"retention"' in x]
        assert list(receipt["cutoffs"]) == [org] and receipt["dry_run"] is False
        assert receipt["counts"]["l2_preferences"] == 0
        with build_platform(cfg, with_knowledge=False) as p:
            assert p.wm.preferences(org, "u-1").get("units").value == "metric"
    finally:
        cleanup_keys(redis_url, f"pref:{{{org}:*")
        cleanup_keys(redis_url, f"cmp:{{org:{org}}}:*")


@pytest.mark.slow
def test_knowledge_refresh_runs_end_to_end(airflow_home: AirflowHome, tmp_path: Path) -> None:
    from context_core.knowledge.edge import EdgeStore

    data, reports = tmp_path / "ctx", tmp_path / "reports"
    out = airflow_home.run(
        "knowledge_refresh",
        extra_env={"CTX_DATA_DIR": str(data), "CTX_REPORTS_DIR": str(reports)},
    )
    assert out["run"]["state"] == "success", out["run"]
    assert out["run"]["tasks"] == {
        "plan": "success",
        "embed_upsert": "success",
        "report": "success",
        "spaces": "success",
        "sync_space": "skipped",  # no spaces: the export path
    }
    summary = json.loads((reports / "ingest_summary.json").read_text())
    assert summary["chunks_written"] > 0 and summary["pages_new"] > 0
    assert list((data / "staging").glob("*.json")) == []  # the staged plan was consumed
    with EdgeStore(data / "qdrant") as store:
        assert store.count("knowledge_main") == summary["chunks_written"]
        sections = {r.payload["section"] for r in store.scroll("knowledge_main")}
    assert {"PUMP", "FAN", "COMP"} <= sections


@pytest.mark.slow
def test_knowledge_refresh_guards_fail_the_dag_and_write_nothing(
    airflow_home: AirflowHome, tmp_path: Path
) -> None:
    """A wrong export path fails the plan task without retries; then a mass delete does."""
    from exports import base_pages, write_export

    from context_core.knowledge.edge import EdgeStore

    data, reports = tmp_path / "ctx", tmp_path / "reports"
    env = {"CTX_DATA_DIR": str(data), "CTX_REPORTS_DIR": str(reports)}
    export = write_export(tmp_path / "export", base_pages(), space="EQT")
    ok = airflow_home.run("knowledge_refresh", conf={"export_path": str(export)}, extra_env=env)
    assert ok["run"]["state"] == "success", ok["run"]
    with EdgeStore(data / "qdrant") as store:
        before = {r.id: r.payload for r in store.scroll("knowledge_main")}

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "index.html").write_text("<html><body><p>intranet landing page</p></body></html>")
    log = tmp_path / "empty.log"
    empty = airflow_home.run(
        "knowledge_refresh", conf={"export_path": str(wrong)}, extra_env=env, log_path=log
    )
    assert empty["run"]["state"] == "failed"
    assert empty["run"]["tasks"]["plan"] == "failed"
    assert empty["run"]["tasks"]["embed_upsert"] == "upstream_failed"
    text = log.read_text()
    assert "no readable Confluence page" in text
    assert "up_for_retry" not in empty["run"]["tasks"].values()

    write_export(export, {"201": base_pages()["201"]}, space="EQT")  # 3 of 4 pages gone
    log = tmp_path / "mass.log"
    mass = airflow_home.run(
        "knowledge_refresh", conf={"export_path": str(export)}, extra_env=env, log_path=log
    )
    assert mass["run"]["tasks"]["plan"] == "failed"
    assert "refusing to delete 3 of 4 pages" in log.read_text()
    with EdgeStore(data / "qdrant") as store:
        assert {r.id: r.payload for r in store.scroll("knowledge_main")} == before

    allowed = airflow_home.run(
        "knowledge_refresh",
        conf={"export_path": str(export), "allow_deletes": True},
        extra_env=env,
    )
    assert allowed["run"]["state"] == "success", allowed["run"]
    with EdgeStore(data / "qdrant") as store:
        assert {r.payload["source"] for r in store.scroll("knowledge_main")} == {"201"}


@pytest.mark.slow
def test_hot_knowledge_merge_runs_end_to_end(airflow_home: AirflowHome, tmp_path: Path) -> None:
    from context_core.config import get_settings
    from context_core.gateway.sanitize import Gateway
    from context_core.ingest.hot import on_fallback
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.embedding import load_encoder
    from context_core.knowledge.memory import KnowledgeMemory

    cfg = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    with EdgeStore(cfg.qdrant_dir) as store:
        enc = load_encoder(cfg)
        km = KnowledgeMemory(store, enc, cfg, Gateway.from_settings(cfg))
        on_fallback("PUMP-0042 coupling torque?", "45 Nm crosswise.", "confirmed", knowledge=km)
        on_fallback("Is COMP-0003 oil synthetic?", "Yes, ISO VG 68.", None, knowledge=km)
        stale = KnowledgeMemory(
            store, enc, cfg, Gateway.from_settings(cfg), clock=lambda: time.time() - 80 * 3600
        )
        on_fallback("FAN-0001 belt interval?", "6 months.", "confirmed", knowledge=stale)
        assert store.count(cfg.collection_hot) == 3

    out = airflow_home.run(
        "hot_knowledge_merge",
        extra_env={"CTX_DATA_DIR": str(cfg.data_dir), "CTX_REPORTS_DIR": str(cfg.reports_dir)},
    )
    assert out["run"]["state"] == "success", out["run"]
    assert set(out["run"]["tasks"].values()) == {"success"}
    with EdgeStore(cfg.qdrant_dir) as store:
        assert store.count(cfg.collection_hot) == 1  # the unconfirmed answer waits
        (merged,) = list(store.scroll(cfg.collection_main))
        assert "45 Nm" in merged.payload["text"]


@pytest.mark.slow
def test_knowledge_refresh_syncs_confluence_spaces_from_the_connection(
    airflow_home: AirflowHome, tmp_path: Path
) -> None:
    """The Confluence source: one mapped task per space, credentials from confluence_default,
    the summary in XCom and the log; bad credentials fail without retries, writing nothing."""
    from confluence_server import ConfluenceState, FakePage, basic, serve

    from context_core.knowledge.edge import EdgeStore

    st = ConfluenceState(cloud=True, auth=basic("ops@example.com", "tok-airflow-3141"))
    for key, sid, topic in (("OPS", "11", "blue-green deploys"), ("SEC", "12", "key rotation")):
        home = FakePage(f"{sid}00", f"{key} home", key, "<p>Start here.</p>")
        st.add_space(key, sid, home)
        st.add(
            FakePage(
                f"{sid}01", f"About {topic}", key, f"<p>We practise {topic}.</p>", parent=home.id
            )
        )
    data, reports = tmp_path / "ctx", tmp_path / "reports"
    with serve(st) as url:
        conn = {"conn_type": "http", "host": url, "login": "ops@example.com"}
        env = {
            "CTX_DATA_DIR": str(data),
            "CTX_REPORTS_DIR": str(reports),
            "AIRFLOW_CONN_CONFLUENCE_DEFAULT": json.dumps({**conn, "password": "wrong"}),
        }
        log = tmp_path / "bad.log"
        bad = airflow_home.run(
            "knowledge_refresh", conf={"spaces": ["OPS"]}, extra_env=env, log_path=log
        )
        assert bad["run"]["tasks"]["sync_space"] == "failed"
        text = log.read_text()
        assert "CTX_CONFLUENCE_TOKEN" in text and "confluence_default" in text
        assert "up_for_retry" not in bad["run"]["tasks"].values()
        assert (
            not (data / "qdrant").exists()
            or EdgeStore(data / "qdrant").info("knowledge_main") is None
        )

        env["AIRFLOW_CONN_CONFLUENCE_DEFAULT"] = json.dumps(
            {**conn, "password": "tok-airflow-3141"}
        )
        log = tmp_path / "ok.log"
        ok = airflow_home.run(
            "knowledge_refresh", conf={"spaces": ["OPS", "SEC"]}, extra_env=env, log_path=log
        )
    assert ok["run"]["state"] == "success", ok["run"]
    assert ok["run"]["tasks"]["plan"] == "skipped" and ok["run"]["tasks"]["sync_space"] == "success"
    text = log.read_text()
    assert "confluence sync OPS summary" in text and "confluence sync SEC summary" in text
    assert "tok-airflow-3141" not in text
    with EdgeStore(data / "qdrant") as store:
        scopes = {r.payload["scope"] for r in store.scroll("knowledge_main")}
    assert scopes == {f"{url}#OPS", f"{url}#SEC"}
