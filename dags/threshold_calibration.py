"""
### threshold_calibration

Re-fits the router's L3 confidence thresholds whenever a new labels file lands.

Scheduled on the asset of the labels file (`CTX_LABELS_PATH`, default
`<CTX_DATA_DIR>/labels/labels.csv`): whoever publishes annotated labels emits that asset
and this DAG runs. A run can also be triggered by hand with the param `labels_path`.

1. **validate**: the Great Expectations suite on the labels (labels in {0,1}, similarity in
   [-1, 1], no duplicate (query_id, point_id), both classes, minimum rows). A failure stops the
   run naming the rows; nothing is written.
2. **calibrate**: label-quality checks, ROC + bootstrap CIs, stores the result as a candidate
   version (`reports/calibrations/<version>/`, provenance `dag:<run_id>`) and promotes it to
   `thresholds.json` (the file the router reads, `CTX_THRESHOLDS_PATH`) only when the
   promotion gates pass (`evaluation.promotion`); writes `reports/calibration_report.md`.
   A failed gate fails the task without retry, naming the gates; the calibration in force is
   untouched. The params `force` + `reason` override the gates (recorded in the provenance).

Logic lives in `evaluation.calibration`; see `ctx eval calibrate --help` for the criteria.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Param, dag, task


def _labels_path() -> Path:
    data_dir = Path(os.environ.get("CTX_DATA_DIR", ".ctx"))
    return Path(os.environ.get("CTX_LABELS_PATH", data_dir / "labels" / "labels.csv")).absolute()


LABELS = Asset(uri=_labels_path().as_uri(), name="retrieval_labels")
THRESHOLDS = Asset(name="confidence_thresholds", uri="file:///ctx/reports/thresholds.json")


@dag(
    dag_id="threshold_calibration",
    schedule=[LABELS],
    start_date=datetime.fromisoformat("2026-01-01T00:00:00+00:00"),
    catchup=False,
    max_active_runs=1,
    tags=["context", "evaluation", "calibration"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    params={
        "labels_path": Param(str(_labels_path()), type="string", description="labels CSV/JSONL"),
        "accept_criterion": Param("youden", enum=["youden", "precision"]),
        "skip_criterion": Param("recall", enum=["recall"]),
        "n_boot": Param(1000, type="integer", minimum=0),
        "force": Param(False, type="boolean", description="promote even if a gate fails"),
        "reason": Param("", type="string", description="why the gates are overridden"),
    },
)
def threshold_calibration() -> None:
    @task
    def validate(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Fail fast (naming rows) before anything is written."""
        from evaluation.labels import load_labels

        path = (params or {})["labels_path"]
        labels = load_labels(path)
        return {"path": path, "sha256": labels.sha256, "n": labels.n}

    @task(outlets=[THRESHOLDS])
    def calibrate(checked: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Fit accept/skip, store the candidate, promote it if the gates pass, write the
        report. A failed gate fails the task (no retry: the labels will not change)."""
        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowFailException

        from context_core.config import get_settings
        from context_core.errors import ContextError
        from evaluation.workflows import calibrate_labels_file

        p = params or {}
        run_id = get_current_context().get("run_id") or "unknown"
        try:
            run = calibrate_labels_file(
                checked["path"],
                get_settings(),
                accept_criterion=p["accept_criterion"],
                skip_criterion=p["skip_criterion"],
                n_boot=int(p["n_boot"]),
                force=bool(p.get("force", False)),
                reason=str(p.get("reason") or "") or None,
                by=f"dag:{run_id}",
            )
        except ContextError as e:
            raise AirflowFailException(str(e)) from e
        staged = run.staged
        if staged is not None and not staged.promoted:
            raise AirflowFailException(
                f"NOT PROMOTED: gate(s) failed: {', '.join(staged.gates.failed)}; candidate "
                f"{staged.version.id} kept, the calibration in force is unchanged"
            )
        return run.to_dict()

    calibrate(validate())


threshold_calibration()
