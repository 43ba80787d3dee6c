"""
### knowledge_refresh

Weekly refresh of L3 knowledge memory (`knowledge_main`) from a Confluence HTML space export.

1. **plan**: parse the export, chunk changed pages (<= 256 model tokens, heading-aware), run
   the Great Expectations chunk suite and diff against the collection. A failed suite fails
   this task, so nothing is written. The plan (chunk texts, never vectors) is staged on disk
   under `$CTX_DATA_DIR/staging/`; only its path and counts travel through XCom.
2. **embed_upsert**: embed the staged chunks in batches, upsert them with deterministic ids,
   delete chunks of removed or shrunk pages of *this export's space* (never another space's,
   never merged hot answers). Emits the `qdrant://knowledge_main` asset.
3. **report**: checks and logs the run summary (`$CTX_REPORTS_DIR/ingest_summary.json`;
   quarantined pages appended to `quarantine.jsonl` with the run id).

**Guards** (the plan task fails at once, without retries, and nothing is written): the export
holds no readable page (a wrong or half-mounted `export_path`); or the run would delete more
than `CTX_INGEST_MAX_DELETE_SHARE` (20 %) of the space's pages. When the pages really were
removed, trigger again with `allow_deletes: true`.

Params: `export_path` (folder or .zip; default: the packaged sample export), `collection`
(default `CTX_COLLECTION_MAIN`), `model` (default `CTX_EMBED_MODEL`), `space` (override the
export's space key), `source_id` (name of the Confluence instance, when two instances share a
space key), `allow_deletes`. Settings come from `CTX_*` environment variables; an
`AIRFLOW_CONN_QDRANT_DEFAULT` connection (e.g. `http://qdrant:6333`) points the job at a
Qdrant server instead of the embedded store. Re-running is safe: pages whose content hash is
unchanged are skipped.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, Param, dag, task

from context_core.sample_data import sample_export_path

KNOWLEDGE_MAIN = Asset("qdrant://knowledge_main")


@dag(
    dag_id="knowledge_refresh",
    schedule="0 2 * * 0",
    start_date=datetime.fromisoformat("2026-01-04T00:00:00+00:00"),
    catchup=False,
    max_active_runs=1,
    tags=["context", "knowledge", "L3", "ingest"],
    doc_md=__doc__,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=2),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
    },
    params={
        "export_path": Param(
            str(sample_export_path()),  # a path lookup, no file is read
            type="string",
            description="Confluence HTML space export: a folder or a .zip.",
        ),
        "collection": Param(
            None, type=["null", "string"], description="Target collection (default from CTX_)."
        ),
        "model": Param(
            None, type=["null", "string"], description="Embedding model name (minilm, bge-m3)."
        ),
        "space": Param(
            None, type=["null", "string"], description="Space key (default: from index.html)."
        ),
        "source_id": Param(
            None,
            type=["null", "string"],
            description="Confluence instance name; only when two instances share a space key.",
        ),
        "allow_deletes": Param(
            False,
            type="boolean",
            description="Allow deleting more than CTX_INGEST_MAX_DELETE_SHARE of the space.",
        ),
    },
)
def knowledge_refresh() -> None:
    @task
    def plan(params: dict[str, Any] | None = None, run_id: str | None = None) -> dict[str, Any]:
        """Parse, chunk, validate and diff; stage the plan on disk, return its path.

        A guard (no readable page, too many deletes) fails the task without retries: re-reading
        the same wrong export cannot succeed.
        """
        from airflow.sdk.exceptions import AirflowFailException

        from context_app.airflow_local import qdrant_url_from_connection
        from context_core.errors import EmptyExportError, MassDeleteError
        from context_core.ingest.pipeline import job_settings, stage_plan

        p = dict(params or {})
        settings = job_settings(
            collection=p.get("collection"),
            model=p.get("model"),
            qdrant_url=qdrant_url_from_connection(),
        )
        try:
            return stage_plan(
                p["export_path"],
                settings=settings,
                run_id=run_id or "manual",
                space=p.get("space"),
                source_id=p.get("source_id"),
                allow_deletes=bool(p.get("allow_deletes")),
            )
        except (EmptyExportError, MassDeleteError) as e:
            raise AirflowFailException(str(e)) from e

    @task(outlets=[KNOWLEDGE_MAIN])
    def embed_upsert(planned: dict[str, Any], params: dict[str, Any] | None = None) -> dict:
        """Embed and upsert the staged chunks; delete removed ones. Returns the summary."""
        from context_app.airflow_local import qdrant_url_from_connection
        from context_core.ingest.pipeline import apply_staged, job_settings

        p = dict(params or {})
        settings = job_settings(
            collection=p.get("collection"),
            model=p.get("model"),
            qdrant_url=qdrant_url_from_connection(),
        )
        return apply_staged(planned["plan_path"], settings=settings).to_dict()

    @task
    def report(summary: dict[str, Any]) -> dict[str, Any]:
        """Log the summary; fail loudly if the run wrote nothing it should have."""
        import logging

        log = logging.getLogger("airflow.task")
        log.info("knowledge_refresh summary: %s", summary)
        if summary["pages_quarantined"] or summary.get("warnings"):
            log.warning(
                "%s pages quarantined, %s warnings: see %s (run %s)",
                summary["pages_quarantined"],
                summary.get("warnings", 0),
                summary.get("quarantine_file"),
                summary.get("run_id"),
            )
        keys = ("pages_seen", "pages_deleted", "chunks_written", "chunks_deleted", "run_id")
        return {k: summary[k] for k in keys}

    report(embed_upsert(plan()))


knowledge_refresh()
