"""
### context_health_report

Daily snapshot of the three memory layers, written to `reports/context_health_report.md`
(plus `health_*.png` trends and a JSON twin):

* **L1**: memory of a realistic `SessionState` and immutability violations (must be 0);
* **L2**: `wm:*` key count (SCAN, never `KEYS *`), expiries since the previous run, top 10 key
  patterns in a SCAN sample;
* **L3**: points per collection and growth, the 5 lowest-confidence queries of the period;
* **CER** (context loaded AND used / steps) with its week-over-week change.

Idempotent per day: a re-run replaces that day's record in `<CTX_DATA_DIR>/health/history.jsonl`.
Settings come from `CTX_*` environment variables. Logic lives in `evaluation.health`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task


@dag(
    dag_id="context_health_report",
    schedule="0 6 * * *",
    start_date=datetime.fromisoformat("2026-01-01T00:00:00+00:00"),
    catchup=False,
    max_active_runs=1,
    tags=["context", "evaluation", "health"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
)
def context_health_report() -> None:
    @task
    def write_report(data_interval_end: datetime | None = None) -> dict[str, str]:
        """Collect the snapshot for the run's day and write the report files."""
        from context_core.config import get_settings
        from evaluation.health import run_health_report

        day = data_interval_end.date() if data_interval_end else None
        paths = run_health_report(get_settings(), day=day)
        return {name: str(path) for name, path in paths.items()}

    @task
    def announce(paths: dict[str, Any]) -> str:
        """Log where the report is (also in XCom for the UI)."""
        import logging

        logging.getLogger("airflow.task").info("context health report: %s", paths["markdown"])
        return str(paths["markdown"])

    announce(write_report())


context_health_report()
