"""BEIR calibration on real human judgements (Cranfield), small enough for CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.beir import load_beir, load_qrels


@pytest.fixture
def cranfield(shared_data: Path) -> Path:
    path = shared_data / "retrieval" / "cranfield"
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"{path} is absent")
    return path


def test_load_beir_keeps_judged_queries_and_caps_the_corpus(cranfield: Path) -> None:
    full = load_beir(cranfield)
    assert len(full.corpus) == 1400 and len(full.queries) == 225
    small = load_beir(cranfield, limit_queries=40, limit_docs=300)
    assert list(small.queries) == list(full.queries)[:40]
    judged = {d for q in small.queries for d in small.qrels[q]}
    assert judged <= set(small.corpus) and len(small.corpus) == max(300, len(judged))
    assert small.qrels["1"]["184"] == 3


def test_qrels_parsing_names_bad_lines(tmp_path: Path) -> None:
    from context_core.errors import DataValidationError

    p = tmp_path / "q.tsv"
    p.write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\n")
    with pytest.raises(DataValidationError, match="line 3"):
        load_qrels(p)


@pytest.mark.slow
@pytest.mark.realdata
def test_calibrate_beir_cranfield_subset(cranfield: Path, settings) -> None:
    from evaluation.beir import calibrate_beir

    run = calibrate_beir(
        cranfield, settings, k=10, limit_queries=40, limit_docs=300, n_boot=100,
        progress=False,
    )  # fmt: skip
    r = run.result
    assert run.stats.n_queries == 40 and r.n == 400
    assert 0 < r.n_pos < r.n and r.n_pos + r.n_neg == 400
    assert 0.5 < r.auc < 1.0  # minilm ranks relevant Cranfield docs above the rest, imperfectly
    assert -1 <= r.skip <= r.accept <= 1
    assert run.stats.hit_rate_at_k > 0.5
    doc = json.loads(run.thresholds_path.read_text())
    assert run.thresholds_path.name == "thresholds_cranfield.json"
    assert (doc["accept"], doc["skip"]) == (r.accept, r.skip)
    assert doc["provenance"]["collection"] == "scratch:beir_cranfield"
    assert doc["provenance"]["model"] == "minilm"
    assert not settings.resolved_thresholds_path.exists()  # runtime file untouched
    assert not any((Path(settings.data_dir) / "scratch").iterdir())  # scratch cleaned up
    md = run.report["markdown"].read_text()
    assert "recall@10" in md and "![ROC]" in md


@pytest.mark.slow
def test_calibrate_sample_against_the_ingested_sample_export(
    settings, redis_url: str, session_id: str
) -> None:
    from context_core.ingest import pipeline
    from context_core.routing.confidence import ConfidencePolicy
    from evaluation.beir import SAMPLE_EVAL_DIR, calibrate_sample

    export = SAMPLE_EVAL_DIR.parent / "confluence" / "EQM"
    summary = pipeline.run_refresh(export, settings=settings, progress=False)
    assert summary.chunks_written > 0
    run = calibrate_sample(settings, n_boot=100)
    r = run.result
    assert run.stats.n_queries >= 20 and r.n_pos > 0 and r.n_neg > 0
    assert r.auc > 0.7  # page-level judgements on the sample are easy for minilm
    policy = ConfidencePolicy.load(settings)  # the router now reads the calibrated pair
    assert (policy.accept, policy.skip) == (r.accept, r.skip)
    assert run.installed_path == settings.resolved_thresholds_path
    assert (settings.reports_dir / "calibration_report.md").is_file()
    # gated promotion: the first run promotes (nothing in force), a rerun on the same labels
    # is not worse (difference exactly 0) and promotes again instead of failing `ctx run`
    assert run.staged is not None and run.staged.promoted and run.staged.gates.passed
    auc = {g.name: g for g in run.staged.gates.gates}["auc_ci"]
    print(f"sample: {r.n} hits ({r.n_pos} relevant), AUC {r.auc:.3f} "
          f"[{auc.values['ci_low']:.3f}, {auc.values['ci_high']:.3f}]")  # fmt: skip
    again = calibrate_sample(settings, n_boot=100)
    assert again.staged is not None and again.staged.promoted, again.staged
    not_worse = {g.name: g for g in again.staged.gates.gates}["not_worse"]
    assert not_worse.values["diff"] == 0.0

    # The router labels L3 hits with the calibrated pair, not the defaults.
    import redis
    from conftest import cleanup_keys

    from context_core.gateway.sanitize import Gateway
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.embedding import load_encoder
    from context_core.knowledge.memory import KnowledgeMemory
    from context_core.routing.router import ContextRouter
    from context_core.session.state import SessionState
    from context_core.traces import TraceWriter
    from context_core.working_memory import WorkingMemory

    gw = Gateway()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    store = EdgeStore(settings.qdrant_dir)
    km = KnowledgeMemory(store, load_encoder(settings), settings, gw)
    km.ensure_collections()  # hot_knowledge too: the router searches both
    state = SessionState.start(session_id, "u", "pump vibration", gateway=gw).advance(
        current_step=1, last_device_id="PUMP-0042"
    )
    query = "At what vibration level must a centrifugal pump be stopped?"
    labels = {}
    try:
        for name, pol in (("default", ConfidencePolicy()), ("calibrated", policy)):
            router = ContextRouter(
                wm=WorkingMemory(client, gw), knowledge=km, policy=pol,
                tracer=TraceWriter(settings.traces_dir, gateway=gw), l3_timeout_ms=120_000,
            )  # fmt: skip
            with router:
                bundle = router.route(state, "default", params={"query": query})
            labels[name] = {f.source: (f.relevance, f.label) for f in bundle.by_layer("L3")}
    finally:
        store.close()
        client.close()
        cleanup_keys(redis_url, f"wm:{{{session_id}}}:*")
    assert labels["calibrated"]
    for score, label in labels["calibrated"].values():
        assert label == policy.label(score)
    # calibrated accept (~0.49) is far below the 0.72 default: more hits become confident
    n_conf = {k: sum(lab == "confident" for _, lab in v.values()) for k, v in labels.items()}
    assert n_conf["calibrated"] > n_conf["default"]
