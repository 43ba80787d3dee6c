"""Airflow glue. Runs the project's DAGs for real on one machine: a private AIRFLOW_HOME,
a SQLite metadata DB migrated once, and ``dag.test()`` in a fresh interpreter; and reads the
optional Qdrant connection inside DAG tasks.

Airflow freezes its configuration when it is first imported, so every parse or run happens in
a subprocess with the environment built here; the caller's process never imports Airflow.
The main job (``ctx run``) and the test-suite fixture both use this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from context_core.errors import ContextError

__all__ = [
    "AirflowRunError",
    "LocalAirflow",
    "confluence_from_connection",
    "default_dags_folder",
    "qdrant_url_from_connection",
]

_MARK = "@@AIRFLOW@@"

# Parses the dags folder (DagBag) and, given a dag id, runs dag.test() once. Prints one JSON
# line after the marker so the caller can read the result out of Airflow's own log output.
_RUNNER = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
args = json.loads(sys.argv[1])
bag = DagBag(dag_folder=args["dags_folder"])
out = {"import_errors": {str(k): str(v) for k, v in bag.import_errors.items()}, "dags": {}}
for dag_id, dag in bag.dags.items():
    out["dags"][dag_id] = {
        "tags": sorted(dag.tags or []),
        "schedule": None if dag.schedule is None else str(dag.schedule),
        "retries": {t.task_id: t.retries for t in dag.tasks},
        "catchup": dag.catchup,
        "has_doc_md": bool(dag.doc_md),
    }
if args.get("dag_id"):
    dag = bag.get_dag(args["dag_id"])
    if dag is None:
        raise SystemExit(f"no DAG {args['dag_id']!r} in {args['dags_folder']}")
    dr = dag.test(run_conf=args.get("conf"))
    out["run"] = {"state": str(dr.state), "run_id": dr.run_id,
                  "tasks": {ti.task_id: str(ti.state) for ti in dr.get_task_instances()},
                  "seconds": (dr.end_date - dr.start_date).total_seconds()
                  if dr.start_date and dr.end_date else None}
print("@@AIRFLOW@@" + json.dumps(out), flush=True)
"""


class AirflowRunError(ContextError):
    """Airflow could not migrate its DB, parse the DAGs, or finish a run."""


def default_dags_folder() -> Path:
    """The repository's ``dags/`` next to the package (an editable install or a checkout)."""
    return Path(__file__).resolve().parents[1] / "dags"


@dataclass(frozen=True)
class LocalAirflow:
    """A private Airflow installation under ``home`` that runs the DAGs in ``dags_folder``.

    ``extra_env`` is added to every run (e.g. the ``CTX_*`` settings the tasks should see).
    """

    home: Path
    dags_folder: Path = field(default_factory=default_dags_folder)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        repo = str(self.dags_folder.parent)
        py_path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
        return {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "GX_ANALYTICS_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": py_path,
            **self.extra_env,
        }

    def prepare(self, *, timeout: float = 600) -> LocalAirflow:
        """Create the home and migrate the metadata DB once (a marker file remembers it)."""
        if not self.dags_folder.is_dir():
            raise AirflowRunError(
                f"DAGs folder {self.dags_folder} does not exist; run from a checkout of the "
                "project or pass the folder explicitly"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        marker = self.home / ".migrated"
        if marker.exists():
            return self
        airflow_bin = Path(sys.executable).with_name("airflow")
        cmd = [str(airflow_bin)] if airflow_bin.exists() else [sys.executable, "-m", "airflow"]
        proc = subprocess.run(
            [*cmd, "db", "migrate"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
        )
        if proc.returncode != 0:
            raise AirflowRunError(
                f"`airflow db migrate` failed in {self.home} (exit {proc.returncode}):\n"
                f"{proc.stderr[-3000:] or proc.stdout[-3000:]}"
            )
        marker.write_text("ok\n", encoding="utf-8")
        return self

    def run(
        self,
        dag_id: str | None = None,
        *,
        conf: dict[str, Any] | None = None,
        extra_env: dict[str, str] | None = None,
        timeout: float = 1800,
        log_path: Path | None = None,
    ) -> dict[str, Any]:
        """Parse every DAG and, given ``dag_id``, ``dag.test()`` it once.

        Returns ``{"import_errors", "dags": {id: {...}}, "run": {"state", "run_id", "tasks",
        "seconds"}}`` (``seconds``: the run's start to end, as Airflow recorded them).
        Airflow's own output goes to ``log_path`` when given. Raises :class:`AirflowRunError`
        with the tail of the output when the interpreter crashes.
        """
        arg = json.dumps({"dags_folder": str(self.dags_folder), "dag_id": dag_id, "conf": conf})
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _RUNNER, arg],
                env={**self.env, **(extra_env or {})},
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.home,
            )
        except subprocess.TimeoutExpired as e:
            raise AirflowRunError(f"DAG {dag_id!r} did not finish within {timeout:.0f} s") from e
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(proc.stdout + "\n--- stderr\n" + proc.stderr, encoding="utf-8")
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK)]
        if proc.returncode != 0 or not lines:
            where = f" (full log: {log_path})" if log_path else ""
            raise AirflowRunError(
                f"Airflow runner for {dag_id or 'DagBag'} failed (exit {proc.returncode}){where}"
                f"\n--- stdout tail\n{proc.stdout[-4000:]}\n--- stderr tail\n{proc.stderr[-4000:]}"
            )
        return dict(json.loads(lines[-1][len(_MARK) :]))


def qdrant_url_from_connection(conn_id: str = "qdrant_default") -> str | None:
    """Qdrant server URL from an Airflow connection (e.g. ``AIRFLOW_CONN_QDRANT_DEFAULT``).

    Called inside DAG tasks; ``None`` (no such connection) means the embedded Qdrant Edge.
    """
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return None
    scheme = conn.conn_type if conn.conn_type in ("http", "https") else "http"
    return f"{scheme}://{conn.host}:{conn.port or 6333}"


def confluence_from_connection(
    conn_id: str = "confluence_default",
) -> tuple[str | None, str | None, str | None]:
    """``(base URL, login, password)`` of an Airflow HTTP connection to a Confluence site.

    Called inside DAG tasks. As for Airflow's HTTP hook, ``host`` may be the whole base URL
    (``https://acme.atlassian.net/wiki``), or a host (with its context path:
    ``wiki.example.com/confluence``) whose scheme is ``schema`` (default https). Login and
    password are the account e-mail and API token (Cloud), or no login and a personal access
    token (Data Center). ``(None, None, None)`` when there is no such connection.
    """
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return None, None, None
    host = (conn.host or "").strip().rstrip("/")
    url: str | None = None
    if host.startswith(("http://", "https://")):
        url = host
    elif host:
        scheme = conn.schema if conn.schema in ("http", "https") else "https"
        name, _, path = host.partition("/")
        port = f":{conn.port}" if conn.port else ""
        url = f"{scheme}://{name}{port}" + (f"/{path}" if path else "")
    return url, conn.login or None, conn.password or None
