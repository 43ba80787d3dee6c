"""
### data_retention

Daily: delete what is older than the owning organisation's `data_retention_policy` (days, the
org's compliance profile), for every organisation of `CTX_API_KEYS_FILE`.

* **enforce**: route-trace lines, L3 points the org's agents wrote (hot answers, uploads,
  merged copies) and user preferences older than the cut-off go
  (`context_core.governance.retention`); L2 session keys keep their own TTLs. The receipt
  (run id, cut-off per org, counts per store; no values) is appended to the audit log and
  returned as the task's XCom. Idempotent: a retried or repeated run deletes nothing more.

Settings come from `CTX_*` environment variables. The same job by hand:
`ctx retention enforce [--dry-run]`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag, task


@dag(
    dag_id="data_retention",
    schedule="30 3 * * *",
    start_date=datetime.fromisoformat("2026-01-01T00:00:00+00:00"),
    catchup=False,
    max_active_runs=1,
    tags=["context", "governance", "retention"],
    doc_md=__doc__,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=15),
    },
)
def data_retention() -> None:
    @task
    def enforce() -> dict[str, Any]:
        """Delete what is past each org's retention; the receipt (counts, no values)."""
        import logging

        from context_app.governance import run_retention
        from context_core.config import get_settings

        receipt = run_retention(get_settings())
        logging.getLogger("airflow.task").info("data_retention receipt: %s", receipt)
        return receipt

    enforce()


data_retention()
