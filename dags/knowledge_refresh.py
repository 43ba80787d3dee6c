"""
### knowledge_refresh

Weekly refresh of L3 knowledge memory (`knowledge_main`) from a Confluence HTML space export,
or straight from a Confluence site (params `confluence_url` and `spaces`).

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

**From a Confluence site** (`spaces` not empty): `plan`, `embed_upsert` and `report` are
skipped and **sync_space** runs once per space (a mapped task, one at a time): list the
space's pages and versions, fetch only the changed bodies and attachments, plan, write, then
move the space's cursor (see `context_core.ingest.sync`). The site and the credentials come
from the Airflow connection `confluence_default` (type HTTP; host = the site's base URL, e.g.
`https://acme.atlassian.net/wiki`; login = account e-mail, password = API token; for Data
Center no login and a personal access token), or `confluence_url` overrides the host. The
space's summary is in the task log and its XCom. Bad credentials, a missing permission or a
mass delete fail the task without retries; a throttling or 5xx storm that outlasts the client's
retries fails it (Airflow retries later) with nothing written.

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
        "spaces": Param(
            [],
            type="array",
            items={"type": "string"},
            description="Confluence space keys to sync from the site (empty: use export_path).",
        ),
        "confluence_url": Param(
            None,
            type=["null", "string"],
            description="Site base URL; default: the host of the confluence_default connection.",
        ),
    },
)
def knowledge_refresh() -> None:
    @task
    def plan(params: dict[str, Any] | None = None, run_id: str | None = None) -> dict[str, Any]:
        """Parse, chunk, validate and diff; stage the plan on disk, return its path.

        A guard (no readable page, too many deletes) fails the task without retries: re-reading
        the same wrong export cannot succeed. Skipped when the run syncs a Confluence site.
        """
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from context_app.airflow_local import qdrant_url_from_connection
        from context_core.errors import EmptyExportError, MassDeleteError
        from context_core.ingest.pipeline import job_settings, stage_plan

        p = dict(params or {})
        if p.get("spaces"):
            raise AirflowSkipException("this run syncs Confluence spaces: see sync_space")
        if p.get("confluence_url"):
            raise AirflowFailException(
                "confluence_url is set but spaces is empty: name the space keys to sync "
                '(e.g. "spaces": ["OPS"]), or drop confluence_url to refresh from export_path'
            )
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

    @task
    def spaces(params: dict[str, Any] | None = None) -> list[str]:
        """The space keys to sync (none: the run refreshes from export_path)."""
        return [str(k) for k in (params or {}).get("spaces") or []]

    @task(max_active_tis_per_dag=1)
    def sync_space(
        space: str, params: dict[str, Any] | None = None, run_id: str | None = None
    ) -> dict[str, Any]:
        """Sync one space from the site; its summary goes to the log and XCom."""
        import logging

        from airflow.sdk.exceptions import AirflowFailException
        from pydantic import SecretStr

        from context_app.airflow_local import (
            confluence_from_connection,
            qdrant_url_from_connection,
        )
        from context_core.errors import ConfluenceAuthError, MassDeleteError
        from context_core.ingest.pipeline import job_settings
        from context_core.ingest.sync import sync_confluence

        p = dict(params or {})
        url, login, password = confluence_from_connection()
        url = p.get("confluence_url") or url
        if not url:
            raise AirflowFailException(
                "no Confluence site: add the confluence_default connection (HTTP; host = the "
                "site's base URL) or pass the confluence_url param"
            )
        settings = job_settings(
            collection=p.get("collection"),
            model=p.get("model"),
            qdrant_url=qdrant_url_from_connection(),
        )
        if password:  # the connection's credentials win over CTX_CONFLUENCE_*
            settings = settings.model_copy(
                update={"confluence_user": login, "confluence_token": SecretStr(password)}
            )
        try:
            (result,) = sync_confluence(
                settings,
                url,
                [space],
                allow_deletes=bool(p.get("allow_deletes")),
                run_id=f"{run_id or 'manual'}-{space}",
            )
        except ConfluenceAuthError as e:
            raise AirflowFailException(
                f"{e} (in Airflow: the login/password of the confluence_default connection)"
            ) from e
        except MassDeleteError as e:
            raise AirflowFailException(str(e)) from e
        out = result.to_dict()
        logging.getLogger("airflow.task").info("confluence sync %s summary: %s", space, out)
        return out

    report(embed_upsert(plan()))
    sync_space.expand(space=spaces())


knowledge_refresh()
