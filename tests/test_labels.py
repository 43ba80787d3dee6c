"""Labels files: read, validated by a real Great Expectations suite, rows named on failure."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from context_core.errors import DataValidationError
from evaluation.labels import (
    CANDIDATE_COLUMNS,
    Query,
    export_candidates,
    load_labels,
    read_queries,
    write_candidates_csv,
)


def _rows(n: int = 24) -> list[dict]:
    return [
        {
            "query_id": f"q{i // 4}",
            "query": f"question {i // 4}",
            "point_id": f"p{i}",
            "similarity": round(0.3 + 0.02 * i, 3),
            "label": i % 2,
            "annotator": "ana",
        }
        for i in range(n)
    ]


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_valid_csv_and_jsonl_load_with_hash(tmp_path: Path) -> None:
    rows = _rows()
    ls = load_labels(_write_csv(tmp_path / "labels.csv", rows))
    assert ls.n == 24 and ls.labels.sum() == 12
    assert ls.scores[0] == pytest.approx(0.3) and len(ls.sha256) == 64
    jl = tmp_path / "labels.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lj = load_labels(jl)
    assert list(lj.labels) == list(ls.labels)
    assert lj.sha256 != ls.sha256  # the hash is of the file as annotated


def test_label_two_on_row_seven_is_named(tmp_path: Path) -> None:
    rows = _rows()
    rows[6]["label"] = 2
    with pytest.raises(DataValidationError) as e:
        load_labels(_write_csv(tmp_path / "labels.csv", rows))
    assert e.value.failures == ["row 7 (query_id=q1, point_id=p6): label=2 is not 0 or 1"]


def test_every_check_names_its_rows(tmp_path: Path) -> None:
    rows = _rows()
    rows[2]["similarity"] = 1.5
    rows[4]["point_id"] = rows[5]["point_id"]  # same query q1 -> duplicate pair
    rows[9]["similarity"] = "high"
    with pytest.raises(DataValidationError) as e:
        load_labels(_write_csv(tmp_path / "labels.csv", rows))
    f = sorted(e.value.failures)
    assert f == sorted(
        [
            "row 3 (query_id=q0, point_id=p2): similarity=1.5 is outside [-1, 1]",
            "row 5 (query_id=q1, point_id=p5): duplicate (query_id, point_id) pair",
            "row 6 (query_id=q1, point_id=p5): duplicate (query_id, point_id) pair",
            "row 10 (query_id=q2, point_id=p9): similarity is empty or not a number",
        ]
    )


def test_one_class_and_too_few_rows_are_rejected(tmp_path: Path) -> None:
    rows = [dict(r, label=1) for r in _rows(5)]
    with pytest.raises(DataValidationError) as e:
        load_labels(_write_csv(tmp_path / "labels.csv", rows))
    assert "labels must contain both classes 0 and 1; found only ['1']" in e.value.failures
    assert any("only 5 rows" in m and "at least 20" in m for m in e.value.failures)
    assert load_labels(_write_csv(tmp_path / "ok.csv", _rows(6)), min_rows=5).n == 6


def test_missing_column_names_it_and_the_expected_header(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "similarity"} for r in _rows()]
    with pytest.raises(DataValidationError, match="lacks column") as e:
        load_labels(_write_csv(tmp_path / "labels.csv", rows))
    assert "similarity" in str(e.value)
    assert "query_id,query,point_id,similarity,label[,annotator]" in str(e.value)


def test_export_candidates_writes_an_annotation_sheet(tmp_path: Path) -> None:
    qf = tmp_path / "q.jsonl"
    qf.write_text('{"query_id": "a", "query": "pump vibration"}\n{"_id": "b", "text": "fan"}\n')
    queries = read_queries(qf)
    assert queries == [Query("a", "pump vibration"), Query("b", "fan")]

    def search(text: str, k: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(id=f"{text[:3]}-{i}", score=0.9 - 0.1 * i,
                            payload={"source": f"page{i}", "section": "PUMP",
                                     "text": "line one\n  line   two " * 40})
            for i in range(k)
        ]  # fmt: skip

    cands = export_candidates(queries, search, k=3)
    out = write_candidates_csv(cands, tmp_path / "cand.csv")
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CANDIDATE_COLUMNS
    assert len(rows) == 6 and rows[0]["point_id"] == "pum-0" and rows[3]["query_id"] == "b"
    assert rows[1]["similarity"] == "0.8" and rows[0]["label"] == ""
    assert rows[0]["text"].startswith("line one line two") and len(rows[0]["text"]) == 300


# --- CLI ------------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> Path:
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("CTX_REDIS_URL", redis_url)
    # small label sets here; the promotion gates have their own tests
    monkeypatch.setenv("CTX_CALIBRATION_MIN_PER_CLASS", "5")
    return tmp_path


def test_cli_calibrate_rejects_a_bad_file_and_writes_thresholds_for_a_good_one(
    cli_env: Path,
) -> None:
    from typer.testing import CliRunner

    from context_app.cli import app

    rows = _rows(40)
    for r in rows:
        r["similarity"] = 0.8 if r["label"] else 0.3
    rows[6]["label"] = 2
    runner = CliRunner()
    bad = runner.invoke(app, ["eval", "calibrate", str(_write_csv(cli_env / "bad.csv", rows))])
    assert bad.exit_code == 1
    assert "row 7 (query_id=q1, point_id=p6): label=2 is not 0 or 1" in bad.output
    assert not (cli_env / "reports" / "thresholds.json").exists()

    rows[6]["label"] = 0
    good = runner.invoke(
        app, ["eval", "calibrate", str(_write_csv(cli_env / "ok.csv", rows)), "--n-boot", "20"]
    )
    assert good.exit_code == 0, good.output
    doc = json.loads((cli_env / "reports" / "thresholds.json").read_text())
    assert (doc["accept"], doc["skip"]) == (0.8, 0.8)
    assert (cli_env / "reports" / "calibration_report.md").is_file()


def test_cli_export_candidates_on_a_real_collection(cli_env: Path) -> None:
    from typer.testing import CliRunner

    from context_app.cli import app
    from context_core.config import get_settings
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.embedding import load_encoder
    from context_core.knowledge.store import PointRecord, point_id

    settings = get_settings()
    texts = {"sop-1": "Pump vibration limits per ISO 10816-3: stop above 7.1 mm/s.",
             "sop-2": "Fan belt tension and alignment procedure.",
             "sop-3": "Compressor oil change interval is 4000 hours."}  # fmt: skip
    enc = load_encoder(settings)
    with EdgeStore(settings.qdrant_dir) as store:
        store.create_collection(settings.collection_main, dim=enc.dim, model=enc.name)
        vecs = enc.encode(list(texts.values()))
        store.upsert(settings.collection_main, [
            PointRecord(point_id(src, 0), v.tolist(), {"source": src, "section": "PUMP",
                                                       "text": t})
            for (src, t), v in zip(texts.items(), vecs, strict=True)
        ])  # fmt: skip
    q = cli_env / "q.jsonl"
    q.write_text('{"query_id": "v", "query": "when must a vibrating pump be stopped"}\n')
    out = cli_env / "cand.csv"
    res = CliRunner().invoke(app, ["eval", "export-candidates", str(q), "--k", "2",
                                   "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["source"] == "sop-1" and len(rows) == 2
    assert rows[0]["label"] == "" and float(rows[0]["similarity"]) > float(rows[1]["similarity"])
