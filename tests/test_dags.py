"""Airflow DAGs: integrity of every file in dags/ and real ``dag.test()`` runs of ours.

Each run happens in a subprocess with a private AIRFLOW_HOME (see the ``airflow_home``
fixture): Airflow freezes its configuration at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import AirflowHome


@pytest.fixture(scope="module")
def parsed(airflow_home: AirflowHome) -> dict:
    return airflow_home.run()


def test_dagbag_has_no_import_errors(parsed: dict) -> None:
    assert parsed["import_errors"] == {}
    assert {"knowledge_refresh", "hot_knowledge_merge"} <= set(parsed["dags"])


def test_every_dag_has_tags_retries_and_schedule(parsed: dict) -> None:
    for dag_id, info in parsed["dags"].items():
        assert info["tags"], f"{dag_id} has no tags"
        assert info["schedule"], f"{dag_id} has no schedule"
        assert info["retries"], f"{dag_id} has no tasks"
        low = {t: r for t, r in info["retries"].items() if r < 1}
        assert not low, f"{dag_id}: tasks without retries: {low}"
        assert info["catchup"] is False, f"{dag_id} should not backfill"
        assert info["has_doc_md"], f"{dag_id} has no doc_md"


def test_our_schedules(parsed: dict) -> None:
    assert "0 2 * * 0" in parsed["dags"]["knowledge_refresh"]["schedule"]
    assert "0 3 * * *" in parsed["dags"]["hot_knowledge_merge"]["schedule"]
