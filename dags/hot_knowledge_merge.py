"""
### hot_knowledge_merge

Daily housekeeping of `hot_knowledge`, the L3 collection where answers confirmed during agent
sessions land first (72 h expiry, Qdrant has no native TTL).

* **merge**: confirmed, unexpired hot points move into `knowledge_main` unless a near-duplicate
  (cosine >= 0.95) is already there; merged and expired points leave `hot_knowledge`.
  Returns the counts (merged, duplicates, expired, kept). Emits `qdrant://knowledge_main`
  when it runs, so jobs scheduled on that asset see merged answers too.

Settings come from `CTX_*` environment variables; an `AIRFLOW_CONN_QDRANT_DEFAULT`
connection points the job at a Qdrant server instead of the embedded store.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, dag, task

KNOWLEDGE_MAIN = Asset("qdrant://knowledge_main")


@dag(
    dag_id="hot_knowledge_merge",
    schedule="0 3 * * *",
    start_date=datetime.fromisoformat("2026-01-01T00:00:00+00:00"),
    catchup=False,
    max_active_runs=1,
    tags=["context", "knowledge", "L3", "hot"],
    doc_md=__doc__,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=15),
    },
)
def hot_knowledge_merge() -> None:
    @task(outlets=[KNOWLEDGE_MAIN])
    def merge() -> dict[str, Any]:
        """Sweep expired hot points and merge confirmed ones into the main collection."""
        from context_app.airflow_local import qdrant_url_from_connection
        from context_core.ingest.pipeline import job_settings
        from context_core.platform import run_hot_merge

        settings = job_settings(qdrant_url=qdrant_url_from_connection())
        return run_hot_merge(settings).to_dict()

    @task
    def report(summary: dict[str, Any]) -> dict[str, Any]:
        """Log the counts (they also land in the task's XCom for the UI)."""
        import logging

        logging.getLogger("airflow.task").info("hot_knowledge_merge summary: %s", summary)
        return summary

    report(merge())


hot_knowledge_merge()
