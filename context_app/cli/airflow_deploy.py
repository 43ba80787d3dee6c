"""`ctx airflow up` and `ctx airflow refresh`: the DAGs under a real local Airflow 3.

PostgreSQL holds the metadata; ``airflow api-server``, ``airflow scheduler`` (LocalExecutor)
and ``airflow dag-processor`` run as separate processes; everything is driven through the
REST API. The logic is in :mod:`context_app.airflow_deploy`.
"""

from __future__ import annotations

import hashlib
import json
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from context_app.airflow_deploy import DEFAULT_PG_URL

if TYPE_CHECKING:
    from rich.console import Console

    from context_app.airflow_deploy import ScheduledRun

app = typer.Typer(
    no_args_is_help=True,
    help="Run the DAGs under a real local Airflow 3: PostgreSQL metadata DB, LocalExecutor, "
    "api-server, scheduler and dag-processor as separate processes.",
)

OUR_DAGS = (
    "knowledge_refresh",
    "hot_knowledge_merge",
    "context_health_report",
    "threshold_calibration",
)

PgUrl = Annotated[
    str,
    typer.Option(
        "--pg-url",
        help="PostgreSQL maintenance DB the deployment's database is created from "
        "(a superuser or a role with CREATEDB).",
    ),
]


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)


def _ctx_env() -> dict[str, str]:
    """CTX_DATA_DIR / CTX_REPORTS_DIR as absolute paths (the processes run in AIRFLOW_HOME)."""
    from context_core.config import get_settings

    s = get_settings()
    return {
        "CTX_DATA_DIR": str(s.data_dir.resolve()),
        "CTX_REPORTS_DIR": str(s.reports_dir.resolve()),
    }


@app.command("up")
def up(
    home: Annotated[
        Path | None,
        typer.Option(
            help="AIRFLOW_HOME (config, task logs, process logs) "
            "(default: <CTX_DATA_DIR>/airflow-deploy)."
        ),
    ] = None,
    port: Annotated[
        int, typer.Option(help="API server / UI port on 127.0.0.1 (0: a free one).")
    ] = 8080,
    pg_url: PgUrl = DEFAULT_PG_URL,
    db: Annotated[
        str | None,
        typer.Option(
            help="Database for the metadata, created if missing and kept "
            "(default: ctx_airflow_<hash of the home>)."
        ),
    ] = None,
    dags_folder: Annotated[
        Path | None, typer.Option(help="Where the DAG files are (default: the checkout's dags/).")
    ] = None,
    unpause: Annotated[
        list[str] | None,
        typer.Option(
            "--unpause",
            help="Unpause this DAG once parsed (repeatable; 'all' for ours). New DAGs start "
            "paused. Note: with catchup=False Airflow runs the most recent missed interval at "
            "once (e.g. last Sunday 02:00 for knowledge_refresh), then follows the schedule.",
        ),
    ] = None,
) -> None:
    """Start a local Airflow in the foreground; Ctrl-C stops it.

    Creates the database if missing, runs `airflow db migrate`, starts the api-server,
    scheduler and dag-processor, waits until the DAGs are parsed and prints the URL and the
    login. Intervals are set low for local use (1 s scheduler heartbeat, the DAGs folder
    listed every 5 s). Each process logs to <home>/<name>.log; if one dies, the others are
    stopped and the command exits 1 naming its log. The database is kept between runs
    (`airflow db migrate` is repeated each start); drop it with `DROP DATABASE <db>`.
    """
    from context_app.airflow_deploy import AirflowDeployError, AirflowDeployment
    from context_app.airflow_local import default_dags_folder

    env = _ctx_env()
    home = (home or Path(env["CTX_DATA_DIR"]) / "airflow-deploy").resolve()
    db_name = db or "ctx_airflow_" + hashlib.sha1(str(home).encode()).hexdigest()[:8]
    dep = AirflowDeployment(
        home=home,
        db_name=db_name,
        pg_url=pg_url,
        port=port,
        dags_folder=(dags_folder or default_dags_folder()).resolve(),
        extra_env=env,
    )
    stop = {"now": False}

    def _on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        typer.echo(f"AIRFLOW_HOME {home}; metadata DB {db_name}; migrating ...")
        dep.prepare()
        dep.start()
        typer.echo(f"started; waiting for the DAGs to be parsed (logs: {home}/*.log)")
        api = dep.wait_ready(dag_ids=OUR_DAGS)
        errors = api.import_errors()
        for err in errors:
            typer.secho(
                f"import error in {err.get('filename')}: {err.get('stack_trace')}",
                fg=typer.colors.RED,
            )
        names = list(OUR_DAGS) if unpause and "all" in unpause else list(unpause or [])
        for dag_id in names:
            api.set_paused(dag_id, False)
        dags = api.dags()
        typer.secho(f"Airflow is up: {dep.base_url}", fg=typer.colors.GREEN, bold=True)
        typer.echo(f"login: admin / {dep.password}  (from {dep.passwords_file})")
        typer.echo(f"REST API: {dep.base_url}/api/v2 (token: POST {dep.base_url}/auth/token)")
        for dag_id, d in sorted(dags.items()):
            state = "paused" if d.get("is_paused") else "active"
            typer.echo(f"  {dag_id:28} {state:7} next run {d.get('next_dagrun_run_after')}")
        typer.echo("Ctrl-C stops every process.")
        while not stop["now"]:
            dep.check_alive()
            time.sleep(2)
    except KeyboardInterrupt:
        pass
    except AirflowDeployError as e:
        dep.stop()
        raise _fail(str(e)) from e
    finally:
        typer.echo("stopping scheduler, dag-processor, api-server ...")
        dep.stop()


@app.command("refresh")
def refresh(
    export: Annotated[
        Path | None,
        typer.Option(help="Confluence HTML export, folder or .zip (default: the bundled sample)."),
    ] = None,
    collection: Annotated[
        str | None, typer.Option(help="Target collection (default: CTX_COLLECTION_MAIN).")
    ] = None,
    pg_url: PgUrl = DEFAULT_PG_URL,
    home: Annotated[
        Path | None,
        typer.Option(
            help="AIRFLOW_HOME for this run (default: a new folder under "
            "<CTX_DATA_DIR>/airflow-runs/)."
        ),
    ] = None,
    keep_db: Annotated[
        bool, typer.Option("--keep-db", help="Keep the run's metadata DB (default: dropped).")
    ] = False,
    compare_dag_test: Annotated[
        bool,
        typer.Option(
            "--compare-dag-test",
            help="Benchmark: also time dag.test() of the same DAG (SQLite, one process) on the "
            "same export. Both runs then write to fresh scratch dirs under the home, so they "
            "do the same work; your CTX_DATA_DIR is left alone.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the run.")] = 900,
    confluence_url: Annotated[
        str | None,
        typer.Option(
            help="Sync from this Confluence site instead of an export (with --space). The "
            "run's confluence_default connection is made from CTX_CONFLUENCE_USER / "
            "CTX_CONFLUENCE_TOKEN.",
            show_default=False,
        ),
    ] = None,
    space: Annotated[
        list[str] | None,
        typer.Option(help="Space key to sync with --confluence-url (repeat for several)."),
    ] = None,
) -> None:
    """Run knowledge_refresh once under a temporary real deployment.

    Starts Airflow on its own new PostgreSQL database, triggers knowledge_refresh through the
    REST API, waits for it, prints the summary and the times, stops every process and drops
    the database.

    Time-based schedules are off in this one-shot deployment (use_job_schedule=False), so
    only the triggered run happens. The summary is the one `ctx ingest` prints for the same
    export (the run writes <CTX_REPORTS_DIR>/ingest_summary.json too).
    """
    from rich.console import Console

    from context_core.sample_data import sample_export_path

    console = Console()
    if confluence_url is not None and (not space or export is not None or compare_dag_test):
        raise _fail(
            "--confluence-url needs --space KEY, and goes without --export and --compare-dag-test"
        )
    source = (export or sample_export_path()).resolve()
    if confluence_url is None and not source.exists():
        raise _fail(f"export {source} does not exist")
    env = _ctx_env()
    if home is None:
        runs = Path(env["CTX_DATA_DIR"]) / "airflow-runs"
        runs.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=runs))
    home = home.resolve()
    if compare_dag_test:
        env = {
            "CTX_DATA_DIR": str(home / "scheduler-ctx"),
            "CTX_REPORTS_DIR": str(home / "scheduler-reports"),
        }
    env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"
    conf: dict[str, Any] = {"export_path": str(source)}
    if collection:
        conf["collection"] = collection
    if confluence_url is not None:
        conf.update(spaces=list(space or []), confluence_url=confluence_url)
        env.update(_confluence_connection_env(confluence_url))
        run, summaries = _refresh_under_scheduler(
            console, home, conf, env=env, pg_url=pg_url, keep_db=keep_db, timeout=timeout
        )
        _print_synced_spaces(console, run, summaries, home)
        return
    run, summary = _refresh_under_scheduler(
        console, home, conf, env=env, pg_url=pg_url, keep_db=keep_db, timeout=timeout
    )
    queued_to_end = _print_scheduled_run(console, run, summary, home)
    if compare_dag_test:
        _compare_with_dag_test(console, home, conf, run, queued_to_end)


def _refresh_under_scheduler(
    console: Console,
    home: Path,
    conf: dict[str, Any],
    *,
    env: dict[str, str],
    pg_url: str,
    keep_db: bool,
    timeout: float,
) -> tuple[ScheduledRun, Any]:
    """Start a temporary deployment, trigger knowledge_refresh, wait; the run and (on
    success) the embed_upsert XCom, the refresh summary."""
    from context_app.airflow_deploy import (
        AirflowDeployError,
        temporary_deployment,
        trigger_and_wait,
    )

    spaces = conf.get("spaces") or []
    source = conf.get("confluence_url") if spaces else conf["export_path"]
    console.print(f"starting Airflow in {home / 'deployment'} (process logs there: *.log)")
    try:
        with temporary_deployment(
            home / "deployment",
            pg_url=pg_url,
            extra_env=env,
            keep_db=keep_db,
            dag_ids=("knowledge_refresh",),
        ) as (dep, api):
            console.print(f"Airflow {dep.base_url} up, metadata DB {dep.db_name}")
            with console.status(f"knowledge_refresh on {source} under the scheduler"):
                run = trigger_and_wait(api, "knowledge_refresh", conf, timeout=timeout)
            summary: Any = None
            if run.state == "success" and spaces:
                summary = [
                    api.xcom("knowledge_refresh", run.run_id, "sync_space", map_index=i)
                    for i in range(len(spaces))
                ]
            elif run.state == "success":
                summary = api.xcom("knowledge_refresh", run.run_id, "embed_upsert")
    except AirflowDeployError as e:
        raise _fail(str(e)) from e
    return run, summary


def _confluence_connection_env(url: str) -> dict[str, str]:
    """``AIRFLOW_CONN_CONFLUENCE_DEFAULT`` for the run, from ``CTX_CONFLUENCE_*`` (an
    environment variable of the deployment's processes, never a command-line argument)."""
    import json

    from context_core.config import get_settings

    s = get_settings()
    if s.confluence_token is None:
        return {}
    conn = {
        "conn_type": "http",
        "host": url,
        "login": s.confluence_user or "",
        "password": s.confluence_token.get_secret_value(),
    }
    return {"AIRFLOW_CONN_CONFLUENCE_DEFAULT": json.dumps(conn)}


def _print_synced_spaces(console: Console, run: ScheduledRun, summaries: Any, home: Path) -> None:
    """Per space: the sync's counts from the sync_space XComs. Exit 1 unless the run
    succeeded."""
    from rich.table import Table

    console.print(f"DAG run {run.run_id}: [bold]{run.state}[/]")
    if run.state != "success" or not isinstance(summaries, list):
        raise _fail(f"knowledge_refresh ended {run.state}; task logs under {home}/deployment/logs")
    for out in summaries:
        table = Table(title=f"sync of {out['space']} (XCom of sync_space)", show_header=False)
        refresh = out["refresh"]
        for key in ("pages_new", "pages_changed", "pages_unchanged", "pages_deleted"):
            table.add_row(key, str(refresh.get(key)))
        table.add_row("chunks_written", str(refresh.get("chunks_written")))
        table.add_row("bodies_fetched", str(out["bodies_fetched"]))
        table.add_row("requests", str(out["requests"]["requests"]))
        console.print(table)
    console.print(f"scheduler: trigger -> success {run.wall_seconds:.1f} s wall")


def _print_scheduled_run(console: Console, run: ScheduledRun, summary: Any, home: Path) -> float:
    """The tasks' states and times and the summary's counts; the run's queued -> end seconds.

    Fails (exit 1) when the run did not succeed with a summary.
    """
    from rich.table import Table

    tasks = ", ".join(
        f"{t}={s} ({run.task_seconds.get(t) or 0:.1f} s)" for t, s in run.tasks.items()
    )
    console.print(f"DAG run {run.run_id}: [bold]{run.state}[/] ({tasks})")
    if run.state != "success" or not isinstance(summary, dict):
        raise _fail(f"knowledge_refresh ended {run.state}; task logs under {home}/deployment/logs")
    table = Table(title="ingest summary (XCom of embed_upsert)", show_header=False)
    for key in (
        "pages_seen",
        "pages_new",
        "pages_changed",
        "pages_unchanged",
        "pages_deleted",
        "pages_quarantined",
        "chunks_written",
        "chunks_deleted",
    ):
        table.add_row(key, str(summary.get(key)))
    console.print(table)
    queued_to_end = _seconds_between(run.run.get("queued_at"), run.run.get("end_date"))
    console.print(
        f"scheduler: trigger -> success {run.wall_seconds:.1f} s wall "
        f"(queued -> end {queued_to_end:.1f} s as recorded by Airflow)"
    )
    return queued_to_end


def _compare_with_dag_test(
    console: Console, home: Path, conf: dict[str, Any], run: ScheduledRun, queued_to_end: float
) -> None:
    """Time dag.test() of knowledge_refresh on the same export (fresh scratch dirs); print
    both runs' times, the last line as JSON."""
    from context_app.airflow_local import AirflowRunError, LocalAirflow, default_dags_folder

    local = LocalAirflow(
        home=home / "dag-test-home",
        dags_folder=default_dags_folder(),
        extra_env={
            "CTX_DATA_DIR": str(home / "dagtest-ctx"),
            "CTX_REPORTS_DIR": str(home / "dagtest-reports"),
        },
    )
    try:
        with console.status("dag.test() knowledge_refresh (SQLite home, one process)"):
            local.prepare()
            started = time.perf_counter()
            out = local.run("knowledge_refresh", conf=conf, log_path=home / "dag-test.log")
            wall = time.perf_counter() - started
    except AirflowRunError as e:
        raise _fail(str(e)) from e
    r = out.get("run", {})
    console.print(
        f"dag.test(): {r.get('state')} in {wall:.1f} s wall (interpreter start + DagBag "
        f"parse + run; run itself {r.get('seconds') or 0:.1f} s)"
    )
    print(
        json.dumps(
            {
                "scheduler_wall_s": round(run.wall_seconds, 2),
                "scheduler_queued_to_end_s": round(queued_to_end, 2),
                "dag_test_wall_s": round(wall, 2),
                "dag_test_run_s": r.get("seconds"),
            }
        )
    )


def _seconds_between(start: str | None, end: str | None) -> float:
    from datetime import datetime

    if not start or not end:
        return float("nan")
    a = datetime.fromisoformat(start.replace("Z", "+00:00"))
    b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    return (b - a).total_seconds()
