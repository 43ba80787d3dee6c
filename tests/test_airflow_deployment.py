"""The DAGs under a real Airflow 3 deployment, driven through its REST API.

One deployment for the module (:mod:`context_app.airflow_deploy`): metadata in a PostgreSQL
database of its own (``ctx_airflow_test_<hex>``, dropped afterwards), LocalExecutor, and
``airflow api-server`` / ``scheduler`` / ``dag-processor`` as separate processes in a private
AIRFLOW_HOME. Its DAGs folder is a copy of ``dags/`` plus one test-only DAG whose task fails
on purpose. The tests run in file order: parse, retry, schedule (unpausing knowledge_refresh
lets the scheduler create its catch-up run), triggered refresh, stop.

Needs PostgreSQL at ``CTX_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/
postgres``, trust auth, a role that may CREATE DATABASE) and its drivers (psycopg2, asyncpg).
Skipped, saying why, only when nothing listens on that host and port; any other problem
(a missing driver, refused credentials) fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import psutil
import pytest

from context_app.airflow_deploy import (
    DEFAULT_PG_URL,
    AirflowApi,
    AirflowDeployError,
    AirflowDeployment,
    copy_dags,
    db_url,
    drop_database,
    new_db_name,
    pg_reachable,
    trigger_and_wait,
)
from context_app.airflow_local import default_dags_folder
from context_core.sample_data import sample_export_path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PG_URL = os.environ.get("CTX_TEST_PG_URL", DEFAULT_PG_URL)
OUR_DAGS = {
    "knowledge_refresh",
    "hot_knowledge_merge",
    "context_health_report",
    "threshold_calibration",
}
RETRY_DAG = "ctx_test_retry"
BOOM = "CTX-DEPLOY-TEST-BOOM-7f3a1c"
TEST_COLLECTION = "knowledge_deploy_test"

RETRY_DAG_FILE = f'''"""Test-only: one task that always fails, retried once after one second."""

from datetime import datetime, timedelta

from airflow.sdk import dag, task


@dag(
    dag_id="{RETRY_DAG}",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["test"],
    default_args={{"retries": 1, "retry_delay": timedelta(seconds=1)}},
)
def {RETRY_DAG}():
    @task
    def explode():
        raise RuntimeError("{BOOM}: deliberate failure")

    explode()


{RETRY_DAG}()
'''

# Fields of the refresh summary that depend on the run, not on the export: times, ids, paths.
RUN_SPECIFIC = {"seconds", "total_seconds", "finished_at", "run_id", "quarantine_file"}


@dataclass
class Deployed:
    dep: AirflowDeployment
    api: AirflowApi
    root: Path
    ingest: subprocess.Popen[str]  # `ctx ingest` of the same export, run alongside


def _start_ctx_ingest(root: Path) -> subprocess.Popen[str]:
    """`ctx ingest SAMPLE --collection TEST_COLLECTION` in its own data dir, in the background."""
    env = {
        **os.environ,
        "CTX_DATA_DIR": str(root / "ingest-ctx"),
        "CTX_REPORTS_DIR": str(root / "ingest-reports"),
        "COLUMNS": "200",
    }
    ctx = Path(sys.executable).with_name("ctx")
    with (root / "ingest.out").open("w") as out, (root / "ingest.err").open("w") as err:
        return subprocess.Popen(
            [
                str(ctx),
                "ingest",
                str(sample_export_path()),
                "--collection",
                TEST_COLLECTION,
                "--no-progress",
            ],
            env=env,
            stdout=out,
            stderr=err,
            text=True,
        )


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    where = urlsplit(PG_URL)
    try:
        socket.create_connection((where.hostname, where.port or 5432), timeout=3).close()
    except OSError as e:
        pytest.skip(f"no PostgreSQL listening at {where.hostname}:{where.port or 5432}: {e}")
    why = pg_reachable(PG_URL)  # something listens: now a failure is a failure, not a skip
    assert why is None, why
    root = tmp_path_factory.mktemp("airflow_deploy")
    dags = copy_dags(default_dags_folder(), root / "dags")
    (dags / f"{RETRY_DAG}.py").write_text(RETRY_DAG_FILE, encoding="utf-8")
    dep = AirflowDeployment(
        home=root / "home",
        db_name=new_db_name("ctx_airflow_test"),
        pg_url=PG_URL,
        dags_folder=dags,
        extra_env={
            "CTX_DATA_DIR": str(root / "ctx"),
            "CTX_REPORTS_DIR": str(root / "reports"),
        },
    )
    ingest: subprocess.Popen[str] | None = None
    try:
        dep.prepare()
        dep.start()
        ingest = _start_ctx_ingest(root)
        api = dep.wait_ready(timeout=240, dag_ids=(*sorted(OUR_DAGS), RETRY_DAG))
        yield Deployed(dep, api, root, ingest)
        api.close()
    finally:
        if ingest is not None and ingest.poll() is None:
            ingest.kill()
        dep.stop()
        drop_database(PG_URL, dep.db_name)


def _aware(ts: str, tz: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).astimezone(ZoneInfo(tz))


def test_dags_are_parsed_by_the_dag_processor_into_postgres(deployed: Deployed) -> None:
    import psycopg2

    api = deployed.api
    dags = api.dags()
    assert OUR_DAGS | {RETRY_DAG} <= set(dags), sorted(dags)
    assert api.import_errors() == []
    # three separate, live processes, each its own process group
    pids = {name: p.pid for name, p in deployed.dep.procs.items()}
    assert set(pids) == {"api-server", "scheduler", "dag-processor"}
    assert len(set(pids.values())) == 3
    assert all(os.getpgid(pid) == pid for pid in pids.values())
    health = api.health()
    assert health["scheduler"]["status"] == health["dag_processor"]["status"] == "healthy"
    # the metadata really is in the deployment's own PostgreSQL database
    url = db_url(PG_URL, deployed.dep.db_name, driver="postgresql")
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT dag_id FROM dag")
        assert {row[0] for row in cur.fetchall()} >= OUR_DAGS
        cur.execute("SELECT job_type FROM job WHERE state = 'running'")
        assert {"SchedulerJob", "DagProcessorJob"} <= {row[0] for row in cur.fetchall()}


def test_failing_task_is_retried_and_its_log_shows_the_error(deployed: Deployed) -> None:
    api = deployed.api
    run = trigger_and_wait(api, RETRY_DAG, timeout=180)
    assert run.state == "failed", run
    ti = api.task_instance(RETRY_DAG, run.run_id, "explode")
    assert ti["state"] == "failed"
    assert ti["try_number"] == 2, ti  # the first try and the one retry
    assert ti["max_tries"] == 1
    for try_number in (1, 2):
        log = api.task_log(RETRY_DAG, run.run_id, "explode", try_number)
        assert BOOM in log, f"try {try_number} log lacks the error:\n{log[-3000:]}"
        assert "RuntimeError" in log


def test_schedule_is_sunday_0200_and_the_scheduler_keeps_it(deployed: Deployed) -> None:
    """Parsed: the next run is a Sunday 02:00. Unpaused: the scheduler creates that run
    (catchup=False runs the most recent interval once), and moves on to the next Sunday."""
    api = deployed.api
    details = api.dag_details("knowledge_refresh")
    tz = details["timezone"]
    assert details["is_paused"] is True
    assert details["timetable_summary"] == "0 2 * * 0"
    first = _aware(details["next_dagrun_run_after"], tz)
    assert (first.weekday(), first.hour, first.minute) == (6, 2, 0), first
    assert _aware(details["next_dagrun_logical_date"], tz) == first

    api.set_paused("knowledge_refresh", False)
    deadline = time.monotonic() + 60
    scheduled: list[dict] = []
    while not scheduled and time.monotonic() < deadline:
        deployed.dep.check_alive()
        runs = api.request("GET", "/dags/knowledge_refresh/dagRuns")["dag_runs"]
        scheduled = [r for r in runs if r["run_type"] == "scheduled"]
        time.sleep(0.5)
    assert len(scheduled) == 1, scheduled
    (cron_run,) = scheduled
    assert _aware(cron_run["logical_date"], tz) == first
    done = api.wait_run("knowledge_refresh", cron_run["dag_run_id"], timeout=300)
    assert done["state"] == "success", done

    after = _aware(api.dag_details("knowledge_refresh")["next_dagrun_run_after"], tz)
    assert (after.weekday(), after.hour, after.minute) == (6, 2, 0), after
    assert after == first + timedelta(days=7)
    assert after > datetime.now(ZoneInfo(tz))


def test_triggered_refresh_matches_ctx_ingest(deployed: Deployed) -> None:
    """The REST-triggered run of knowledge_refresh ingests the sample export exactly as
    `ctx ingest` does (same counts, same scope), through plan -> embed_upsert -> report."""
    api = deployed.api
    api.set_paused("knowledge_refresh", False)
    conf = {"export_path": str(sample_export_path()), "collection": TEST_COLLECTION}
    run = trigger_and_wait(api, "knowledge_refresh", conf, timeout=600)
    assert run.state == "success", run
    assert run.tasks == {
        "plan": "success",
        "embed_upsert": "success",
        "report": "success",
        "spaces": "success",
        "sync_space": "skipped",  # no spaces given: the export path
    }
    assert run.run["run_type"] == "manual"
    summary = api.xcom("knowledge_refresh", run.run_id, "embed_upsert")
    reported = api.xcom("knowledge_refresh", run.run_id, "report")
    assert reported == {k: summary[k] for k in reported} and reported["run_id"] == run.run_id
    log = api.task_log("knowledge_refresh", run.run_id, "report", 1)
    assert "knowledge_refresh summary:" in log
    on_disk = json.loads((deployed.root / "reports" / "ingest_summary.json").read_text())
    assert on_disk["run_id"] == run.run_id

    deployed.ingest.wait(timeout=300)
    out = (deployed.root / "ingest.out").read_text()
    err = (deployed.root / "ingest.err").read_text()
    assert deployed.ingest.returncode == 0, (out + err)[-3000:]
    cli = json.loads((deployed.root / "ingest-reports" / "ingest_summary.json").read_text())
    assert cli["pages_new"] > 0 and cli["chunks_written"] > 0
    comparable = sorted(set(cli) - RUN_SPECIFIC)
    assert {k: summary[k] for k in comparable} == {k: cli[k] for k in comparable}
    assert on_disk == summary
    # ... and what `ctx ingest` printed says the same
    for label, key in (
        ("pages seen", "pages_seen"),
        ("chunks written", "chunks_written"),
        ("pages quarantined", "pages_quarantined"),
    ):
        assert re.search(rf"{label}\W+{summary[key]:,}\b", out), (label, out)

    queued_to_end = (
        datetime.fromisoformat(run.run["end_date"].replace("Z", "+00:00"))
        - datetime.fromisoformat(run.run["queued_at"].replace("Z", "+00:00"))
    ).total_seconds()
    print(
        f"\nknowledge_refresh under the scheduler: trigger -> success {run.wall_seconds:.1f} s "
        f"wall, queued -> end {queued_to_end:.1f} s ({summary['chunks_written']} chunks; "
        f"task seconds {run.task_seconds})"
    )


def test_stop_ends_every_process_and_a_dead_one_names_its_log(deployed: Deployed) -> None:
    dep = deployed.dep
    procs = [psutil.Process(p.pid) for p in dep.procs.values()]
    family = procs + [c for p in procs for c in p.children(recursive=True)]
    dead = dep.procs["dag-processor"]
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait(timeout=30)
    with pytest.raises(AirflowDeployError) as err:
        dep.check_alive()
    assert str(dep.log_path("dag-processor")) in str(err.value)
    assert "`airflow dag-processor` exited" in str(err.value)
    dep.stop()
    assert dep.procs == {}
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    for name in ("api-server", "scheduler", "dag-processor"):
        assert dep.log_path(name).stat().st_size > 0


def test_processes_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    """A deployment's processes get SIGTERM when their starter dies, even by SIGKILL (a killed
    test run or `ctx airflow up` must not leave a scheduler running)."""
    pid_file = tmp_path / "child.pid"
    starter = (
        "import subprocess, sys, time\n"
        "from context_app.airflow_deploy import _die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
        "                     start_new_session=True, preexec_fn=_die_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = psutil.Process(int(pid_file.read_text()))
        assert child.is_running()
        parent.kill()  # SIGKILL: no cleanup code of the starter runs
        parent.wait(timeout=10)
        child.wait(timeout=10)  # psutil.TimeoutExpired if it survived
        assert not child.is_running()
    finally:
        if parent.poll() is None:
            parent.kill()


def test_ctx_airflow_refresh_syncs_a_confluence_site(tmp_path: Path) -> None:
    """`ctx airflow refresh --confluence-url URL --space KEY`: a temporary deployment of its
    own, the confluence_default connection made from CTX_CONFLUENCE_*, one sync_space task,
    its XCom printed; the token appears in no output and no file of the run."""
    from confluence_server import ConfluenceState, FakePage, basic, serve

    where = urlsplit(PG_URL)
    try:
        socket.create_connection((where.hostname, where.port or 5432), timeout=3).close()
    except OSError as e:
        pytest.skip(f"no PostgreSQL listening at {where.hostname}:{where.port or 5432}: {e}")
    token = "ATATT-deploy-test-5e81c0"
    st = ConfluenceState(cloud=True, auth=basic("ops@example.com", token))
    home = FakePage("900", "Ops home", "OPS", "<p>Start here.</p>")
    st.add_space("OPS", "77", home)
    for i, topic in enumerate(("failover drills", "pager rotation", "backup checks")):
        st.add(
            FakePage(f"90{i + 1}", topic.title(), "OPS", f"<p>We run {topic}.</p>", parent="900")
        )
    env = {
        **os.environ,
        "CTX_DATA_DIR": str(tmp_path / "ctx"),
        "CTX_REPORTS_DIR": str(tmp_path / "reports"),
        "CTX_CONFLUENCE_USER": "ops@example.com",
        "CTX_CONFLUENCE_TOKEN": token,
        "COLUMNS": "200",
    }
    ctx = Path(sys.executable).with_name("ctx")
    with serve(st) as url:
        proc = subprocess.run(
            [
                str(ctx),
                "airflow",
                "refresh",
                "--confluence-url",
                url,
                "--space",
                "OPS",
                "--pg-url",
                PG_URL,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "sync of OPS" in out and re.search(r"pages_new\W+4\b", out), out[-3000:]
    assert st.bodies_served() >= 1
    assert token not in out
    for path in (tmp_path / "ctx").rglob("*"):
        if path.is_file() and path.stat().st_size < 20_000_000:
            assert token.encode() not in path.read_bytes(), path
