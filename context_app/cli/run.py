"""``ctx run``: the main job, end to end, on embedded defaults.

1. knowledge refresh of a Confluence export (the bundled sample by default) through the real
   ``knowledge_refresh`` Airflow DAG (``dag.test()`` in a private AIRFLOW_HOME);
2. calibration of the accept/skip thresholds from the sample's labelled queries, installed as
   ``reports/thresholds.json`` for the router to read back;
3. a scripted agent session routed through L1/L2/L3 with the calibrated thresholds (traces);
4. the CER report and the daily context-health report from those traces.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from context_core.platform import Platform


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command(name="run")(run)


def run(
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            help="Confluence HTML space export (folder or .zip). Default: the bundled sample.",
        ),
    ] = None,
    dags_folder: Annotated[
        Path | None, typer.Option(help="Where the DAG files are. Default: the checkout's dags/.")
    ] = None,
    skip_calibration: Annotated[
        bool, typer.Option(help="Keep the thresholds in force instead of recalibrating.")
    ] = False,
) -> None:
    """Main job: refresh knowledge (Airflow DAG), calibrate thresholds, route a session, report.

    Uses CTX_* settings: embedded Valkey and Qdrant Edge under CTX_DATA_DIR (./.ctx) unless
    CTX_REDIS_URL / CTX_QDRANT_URL are set; reports land in CTX_REPORTS_DIR (./reports).
    """
    from rich.console import Console

    from context_core.config import get_settings
    from context_core.errors import ContextError
    from context_core.sample_data import sample_export_path

    console = Console()
    settings = get_settings()
    # Absolute paths: the Airflow subprocess runs in its own working directory.
    settings = get_settings(
        data_dir=settings.data_dir.resolve(), reports_dir=settings.reports_dir.resolve()
    )
    source = (export or sample_export_path()).resolve()
    if not source.exists():
        console.print(f"[red]export {source} does not exist[/]; pass --export PATH")
        raise typer.Exit(2)
    started = time.perf_counter()
    try:
        _main_job(console, settings, source, dags_folder, skip_calibration)
    except ContextError as e:
        console.print(f"[red bold]main job failed:[/] {e}")
        raise typer.Exit(1) from e
    console.rule(f"[green]done in {time.perf_counter() - started:.0f} s")


def _main_job(
    console: Any, settings: Any, source: Path, dags_folder: Path | None, skip_cal: bool
) -> None:
    from context_core.platform import build_platform

    with build_platform(settings) as platform:
        console.rule("[bold]1/4 knowledge refresh (Airflow DAG knowledge_refresh)")
        _refresh(console, settings, source, dags_folder, platform.provider.url)

        # opened after the refresh: the DAG's process writes the embedded store meanwhile
        _ = platform.knowledge

        console.rule("[bold]2/4 threshold calibration (sample queries, page-level qrels)")
        if skip_cal:
            console.print("skipped (--skip-calibration): the thresholds in force stay")
        else:
            _calibrate(console, settings)

        console.rule("[bold]3/4 scripted agent session through L1/L2/L3")
        _session(console, settings, platform)

        console.rule("[bold]4/4 reports: CER and context health")
        _reports(console, settings, platform)


def _refresh(
    console: Any, settings: Any, source: Path, dags_folder: Path | None, redis_url: str
) -> None:
    from rich.table import Table

    from context_app.airflow_local import AirflowRunError, LocalAirflow, default_dags_folder

    airflow = LocalAirflow(
        home=settings.data_dir / "airflow",
        dags_folder=(dags_folder or default_dags_folder()).resolve(),
        extra_env={
            "CTX_DATA_DIR": str(settings.data_dir),
            "CTX_REPORTS_DIR": str(settings.reports_dir),
            "CTX_REDIS_URL": redis_url,
        },
    )
    log_path = settings.data_dir / "airflow" / "logs" / "knowledge_refresh.log"
    with console.status("migrating Airflow's metadata DB (first run only)"):
        airflow.prepare()
    with console.status(f"dag.test() knowledge_refresh on {source} (log: {log_path})"):
        out = airflow.run("knowledge_refresh", conf={"export_path": str(source)}, log_path=log_path)
    run = out.get("run", {})
    tasks = ", ".join(f"{t}={s}" for t, s in run.get("tasks", {}).items())
    console.print(f"DAG run {run.get('run_id')}: [bold]{run.get('state')}[/] ({tasks})")
    if run.get("state") != "success":
        raise AirflowRunError(f"knowledge_refresh ended {run.get('state')}; see {log_path}")
    summary_path = settings.reports_dir / "ingest_summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    table = Table(title="ingest summary", show_header=False)
    console.print(f"summary: {summary_path}")
    for key in (
        "pages_seen", "pages_new", "pages_changed", "pages_unchanged", "pages_deleted",
        "pages_quarantined", "chunks_written", "chunks_deleted", "total_seconds",
    ):  # fmt: skip
        if key in summary:
            table.add_row(key, str(summary[key]))
    console.print(table)


def _calibrate(console: Any, settings: Any) -> None:
    from evaluation import calibrate_sample

    with console.status("retrieving top-10 for each sample query and calibrating"):
        result = calibrate_sample(settings)
    r = result.result
    ci = r.ci["auc"]
    console.print(
        f"AUC {r.auc:.3f} (95% CI {ci.low:.3f}-{ci.high:.3f}) on {result.labels.n} labelled "
        f"hits; accept [bold]{r.accept:.3f}[/], skip [bold]{r.skip:.3f}[/] "
        f"-> {result.installed_path or result.thresholds_path}"
    )
    staged = result.staged
    if staged is not None:
        verdict = (
            f"promoted {staged.version.id}"
            if staged.promoted
            else f"[red]NOT PROMOTED[/]: gate(s) failed: {', '.join(staged.gates.failed)}; "
            f"the calibration in force stays (candidate {staged.version.id})"
        )
        console.print(f"calibration version: {verdict}")
    for name, path in result.report.items():
        console.print(f"  {name}: {path}")


def _session(console: Any, settings: Any, platform: Platform) -> None:
    from context_app.demo import run_demo

    policy = platform.policy.current()
    console.print(f"thresholds in force: accept {policy.accept:.3f}, skip {policy.skip:.3f} "
                  f"({policy.source})")  # fmt: skip
    result = run_demo(settings, platform=platform)
    from rich.table import Table

    table = Table(title=f"session {result.session_id}: one row per routed step")
    for col in ("intent", "fragments", "L3 (confident/low)", "degraded", "total ms"):
        table.add_column(col)
    for step in result.steps:
        b = step.bundle
        l3 = b.by_layer("L3")
        confident = sum(1 for f in l3 if f.label == "confident")
        table.add_row(
            step.intent, str(len(b.fragments)), f"{confident}/{len(l3) - confident}",
            str(b.degraded), f"{b.timings_ms.get('total', 0.0):.1f}",
        )  # fmt: skip
    console.print(table)
    console.print(f"traces: {result.traces_dir or settings.traces_dir}")


def _reports(console: Any, settings: Any, platform: Platform) -> None:
    from evaluation import compute_cer, run_health_report
    from evaluation.report import write_cer_report

    # the platform's policy: checked against the encoder that built the collections (under
    # CTX_EMBED_BACKEND=auto, minilm+onnx-int8), as the calibration of step 2 recorded it
    policy = platform.policy.current()
    report = compute_cer(settings.traces_dir, accept=policy.accept)
    cer_paths = write_cer_report(report, settings.reports_dir, accept=policy.accept)
    o = report.overall
    console.print(f"CER {o.cer:.1%} ({o.n_effective}/{o.n_steps} steps loaded and used)")
    for v in report.failures[:5]:
        console.print(f"  [yellow]{v.intent} step {v.step}[/]: {'; '.join(v.reasons)}")
    health_paths = run_health_report(settings, redis_client=platform.redis, store=platform.store)
    for name, path in {**cer_paths, **health_paths}.items():
        console.print(f"  {name}: {path}")
