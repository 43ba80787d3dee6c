"""The evaluation DAGs: parsed by a real DagBag and run with dag.test() in a private
AIRFLOW_HOME (the ``airflow_home`` fixture)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import AirflowHome


def _labels(path: Path, n: int = 80) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["query_id", "query", "point_id", "similarity", "label"])
        for i in range(n):
            label = int(i % 2 == 0)
            w.writerow([f"q{i // 4}", "pump vibration", f"p{i}", 0.8 if label else 0.4 + i / 1000,
                        label])  # fmt: skip
    return path


@pytest.fixture(scope="module")
def parsed(airflow_home: AirflowHome) -> dict:
    return airflow_home.run()


def test_eval_dags_parse_with_schedules_tags_and_retries(parsed: dict) -> None:
    assert not {k: v for k, v in parsed["import_errors"].items() if "calibration" in k
                or "health" in k}  # fmt: skip
    health = parsed["dags"]["context_health_report"]
    calib = parsed["dags"]["threshold_calibration"]
    assert "0 6 * * *" in health["schedule"]
    assert "retrieval_labels" in calib["schedule"]  # scheduled on the labels asset
    for info in (health, calib):
        assert info["tags"] and info["catchup"] is False and info["has_doc_md"]
        assert all(r >= 1 for r in info["retries"].values())
    assert set(calib["retries"]) == {"validate", "calibrate"}


@pytest.mark.slow
def test_threshold_calibration_dag_writes_thresholds(
    airflow_home: AirflowHome, tmp_path: Path
) -> None:
    labels = _labels(tmp_path / "labels.csv")
    reports = tmp_path / "reports"
    out = airflow_home.run(
        "threshold_calibration",
        conf={"labels_path": str(labels), "n_boot": 50},
        extra_env={"CTX_DATA_DIR": str(tmp_path / "ctx"), "CTX_REPORTS_DIR": str(reports)},
    )
    assert out["run"]["state"] == "success", out["run"]
    assert out["run"]["tasks"] == {"validate": "success", "calibrate": "success"}
    doc = json.loads((reports / "thresholds.json").read_text())
    assert doc["accept"] == 0.8 and doc["skip"] == 0.8  # perfectly separated at 0.8
    assert doc["provenance"]["labels_path"] == str(labels) and doc["n"] == 80
    assert (reports / "calibration_report.md").is_file()
    assert (reports / "calibration_roc.png").stat().st_size > 1000
    version = (reports / "calibrations" / "current").read_text().strip()
    prov = json.loads((reports / "calibrations" / version / "provenance.json").read_text())
    assert doc["version"] == version and prov["ran_by"].startswith("dag:")

    # a small set (20 per class < 30) fails its task, names the gate, and changes nothing
    before = (reports / "thresholds.json").read_bytes()
    small = _labels(tmp_path / "small.csv", n=40)
    out = airflow_home.run(
        "threshold_calibration",
        conf={"labels_path": str(small), "n_boot": 50},
        extra_env={"CTX_DATA_DIR": str(tmp_path / "ctx"), "CTX_REPORTS_DIR": str(reports)},
    )
    assert out["run"]["state"] == "failed", out["run"]
    assert out["run"]["tasks"]["calibrate"] == "failed"
    assert (reports / "thresholds.json").read_bytes() == before
    assert (reports / "calibrations" / "current").read_text().strip() == version
    assert (
        "NOT PROMOTED: gate(s) failed: labels_per_class"
        in (reports / "calibration_report.md").read_text()
    )


@pytest.mark.slow
def test_context_health_report_dag_writes_the_report(
    airflow_home: AirflowHome, tmp_path: Path, redis_url: str
) -> None:
    reports = tmp_path / "reports"
    out = airflow_home.run(
        "context_health_report",
        extra_env={
            "CTX_DATA_DIR": str(tmp_path / "ctx"),
            "CTX_REPORTS_DIR": str(reports),
            "CTX_REDIS_URL": redis_url,
        },
    )
    assert out["run"]["state"] == "success", out["run"]
    assert out["run"]["tasks"] == {"write_report": "success", "announce": "success"}
    md = (reports / "context_health_report.md").read_text()
    assert "immutability violations" in md and "`wm:*` keys" in md
    history = (tmp_path / "ctx" / "health" / "history.jsonl").read_text().splitlines()
    assert len(history) == 1 and json.loads(history[0])["l1"]["violations"] == 0
