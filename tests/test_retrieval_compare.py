"""Dense vs sparse vs hybrid retrieval, measured side by side (issue 14).

Metric functions against hand-computed cases; the whole comparison end to end on a tiny BEIR
folder (English and Chinese) on real Qdrant Edge with the packaged offline model; the real
data sets (slow, realdata).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evaluation.retrieval_compare import ModeResult
from evaluation.retrieval_metrics import (
    auc,
    bootstrap_ci,
    dcg,
    grouped_auc_ci,
    mrr_at_k,
    ndcg_at_k,
    paired_ratio_ci,
    ranking_metric,
    recall_at_k,
    split_queries,
)

# --- ranking metrics, by hand ------------------------------------------------------------


def test_dcg_by_hand() -> None:
    # 3/log2(2) + 0/log2(3) + 1/log2(4) = 3 + 0 + 0.5
    assert dcg([3, 0, 1]) == pytest.approx(3.5)
    assert dcg([]) == 0.0


def test_ndcg_uses_graded_qrels_and_the_ideal_over_all_judged_documents() -> None:
    qrels = {"a": 3, "b": 2, "c": 1, "n": 0}
    # retrieved c, x (unjudged), a: DCG = 1/1 + 0 + 3/2 = 2.5
    # ideal a, b, c: 3/1 + 2/log2(3) + 1/2 = 3.5 + 1.2618595...
    ideal = 3 + 2 / math.log2(3) + 0.5
    assert ndcg_at_k(["c", "x", "a"], qrels, k=3) == pytest.approx(2.5 / ideal)
    assert ndcg_at_k(["a", "b", "c"], qrels, k=3) == pytest.approx(1.0)
    # k cuts both the run and the ideal: top-1 'a' is perfect at k=1
    assert ndcg_at_k(["a", "x"], qrels, k=1) == pytest.approx(1.0)
    # a relevant document below k does not count; a judged-0 document gains nothing
    assert ndcg_at_k(["n", "x", "a"], qrels, k=2) == 0.0
    # no relevant document judged: 0, not NaN
    assert ndcg_at_k(["a"], {"a": 0}, k=10) == 0.0


def test_recall_and_mrr_by_hand() -> None:
    qrels = {"a": 1, "b": 2, "c": 0}
    assert recall_at_k(["b", "c", "z"], qrels, k=2) == pytest.approx(0.5)
    assert recall_at_k(["b", "a"], qrels, k=2) == pytest.approx(1.0)
    assert recall_at_k(["z", "y", "a"], qrels, k=2) == 0.0
    assert recall_at_k(["a"], {"a": 0}, k=1) == 0.0
    assert mrr_at_k(["x", "y", "a"], qrels, k=3) == pytest.approx(1 / 3)
    assert mrr_at_k(["x", "y", "a"], qrels, k=2) == 0.0
    assert mrr_at_k(["c", "b"], qrels, k=10) == pytest.approx(0.5)  # grade 0 is not relevant
    with pytest.raises(ValueError, match="k must be > 0"):
        recall_at_k(["a"], qrels, k=0)


def test_unknown_metric_name_raises() -> None:
    assert ranking_metric("ndcg") is ndcg_at_k
    with pytest.raises(ValueError, match="unknown ranking metric 'map'"):
        ranking_metric("map")


# --- AUC and intervals ---------------------------------------------------------------------


def test_auc_by_hand_with_ties() -> None:
    # positives 0.9 and 0.7, negatives 0.8 and 0.6: pairs won 0.9>0.8, 0.9>0.6, 0.7>0.6 -> 3/4
    assert auc([0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0]) == pytest.approx(0.75)
    assert auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # a tie counts one half
    # positive 0.5 ties one negative (0.5) and beats the other (0.1): (0.5 + 1) / 2
    assert auc([0.5, 0.5, 0.1], [1, 0, 0]) == pytest.approx(0.75)
    assert auc([0.1, 0.9], [1, 0]) == 0.0
    with pytest.raises(ValueError, match="both classes"):
        auc([0.1, 0.2], [1, 1])


def test_auc_matches_sklearn_on_random_scores_with_ties() -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    s = np.round(rng.normal(size=500), 1)  # rounded: many ties
    y = (rng.random(500) < 0.3 + 0.2 * (s > 0)).astype(int)
    assert auc(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_bootstrap_ci_is_seeded_and_brackets_the_mean() -> None:
    v = np.r_[np.zeros(50), np.ones(50)]
    a = bootstrap_ci(v, n_boot=500, seed=1)
    assert a == bootstrap_ci(v, n_boot=500, seed=1)
    assert a.low < 0.5 < a.high and a.low > 0.35 and a.high < 0.65 and a.level == 0.95
    const = bootstrap_ci([0.4] * 10, n_boot=100)
    assert const.low == pytest.approx(0.4) and const.high == pytest.approx(0.4)
    assert math.isnan(bootstrap_ci([1.0, 2.0], n_boot=0).low)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci([1.0], n_boot=-1)


def test_paired_ratio_ci_resamples_the_same_queries_for_both() -> None:
    den = np.array([0.1, 0.5, 0.2, 0.9, 0.4])
    point, ci = paired_ratio_ci(2 * den, den, n_boot=200, seed=0)
    # numerator is exactly twice the denominator per query: every paired resample gives 2
    assert point == pytest.approx(2.0)
    assert ci.low == pytest.approx(2.0) and ci.high == pytest.approx(2.0)
    point, _ = paired_ratio_ci([1.0, 0.0], [0.0, 0.0], n_boot=10)
    assert math.isnan(point)


def test_grouped_auc_ci_resamples_whole_queries() -> None:
    # every query ranks its relevant hit first: AUC 1 in every resample
    scores = [0.9, 0.2, 0.8, 0.1, 0.7, 0.3]
    labels = [1, 0, 1, 0, 1, 0]
    groups = ["q1", "q1", "q2", "q2", "q3", "q3"]
    ci = grouped_auc_ci(scores, labels, groups, n_boot=200, seed=0)
    assert ci.low == 1.0 and ci.high == 1.0
    # one query inverted: resamples range from 0 (only that query drawn) to 1
    flipped = [0.9, 0.2, 0.8, 0.1, 0.3, 0.7]
    ci = grouped_auc_ci(flipped, labels, groups, n_boot=400, seed=0)
    assert ci.low < auc(flipped, labels) < ci.high
    with pytest.raises(ValueError, match="groups"):
        grouped_auc_ci(scores, labels, groups[:-1])


def test_split_queries_is_seeded_disjoint_and_ordered() -> None:
    ids = [f"q{i}" for i in range(11)]
    train, test = split_queries(ids, train_share=0.5, seed=7)
    assert (train, test) == split_queries(ids, train_share=0.5, seed=7)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(ids)
    assert len(train) == round(0.5 * 11)
    assert train == [q for q in ids if q in train]  # input order kept
    assert split_queries(ids, seed=8) != (train, test)
    two = split_queries(["a", "b"], train_share=0.9)
    assert len(two[0]) == 1 and len(two[1]) == 1
    with pytest.raises(ValueError, match="at least 2"):
        split_queries(["a"])


# --- chunk folding ------------------------------------------------------------------------


def test_fold_chunks_keeps_each_document_once_at_its_best_chunk() -> None:
    from context_core.knowledge.store import Hit
    from evaluation.retrieval_compare import fold_chunks

    def hit(i: int, doc: str, score: float) -> Hit:
        return Hit(id=f"p{i}", score=score, payload={"source": doc})

    hits = [hit(0, "a", 0.9), hit(1, "a", 0.8), hit(2, "b", 0.7), hit(3, "c", 0.6)]
    folded = fold_chunks(hits, k=2)
    assert [(h.id, h.payload["source"]) for h in folded] == [("p0", "a"), ("p2", "b")]
    assert [h.rank for h in folded] == [1, 2]


# --- end to end on a tiny BEIR folder ------------------------------------------------------

TINY_DOCS = {
    "en1": ("Bearing wear", "Bearing wear in centrifugal pumps raises vibration velocity."),
    "en2": ("Impeller cavitation", "Cavitation erodes the impeller blades and adds noise."),
    "en3": ("Seal leakage", "Mechanical seal leakage shows as drips at the gland."),
    "en4": ("Motor overheating", "Blocked cooling fins make the motor windings overheat."),
    "en5": ("Shaft misalignment", "Misaligned couplings cause axial vibration at 2x speed."),
    "en6": ("Lubrication", "Grease intervals for rolling bearings depend on speed and load."),
    "en7": ("Boundary layer", "Laminar boundary layers separate under adverse pressure."),
    "en8": ("Heat transfer", "Heat transfer to a flat plate in supersonic flow was measured."),
    "zh1": ("轴承磨损", "离心泵轴承磨损会导致振动速度升高，需要更换轴承。"),
    "zh2": ("叶轮气蚀", "气蚀会侵蚀叶轮叶片并产生噪声，应提高入口压力。"),
    "zh3": ("机械密封", "机械密封泄漏表现为压盖处滴水，需检查密封面。"),
    "zh4": ("电机过热", "散热片堵塞会使电机绕组过热，应清洁散热片。"),
    "zh5": ("联轴器对中", "联轴器不对中会在两倍转速处引起轴向振动。"),
    "zh6": ("润滑周期", "滚动轴承的润滑脂更换周期取决于转速和负载。"),
}
TINY_QUERIES = {
    "q1": ("why does bearing wear raise pump vibration", {"en1": 2, "en6": 1}),
    "q2": ("impeller cavitation noise", {"en2": 2}),
    "q3": ("seal leakage drips at the gland", {"en3": 2}),
    "q4": ("motor windings overheat cooling fins", {"en4": 2}),
    "q5": ("axial vibration from misaligned couplings", {"en5": 2}),
    "q6": ("grease interval rolling bearings", {"en6": 2, "en1": 1}),
    "q7": ("boundary layer separation adverse pressure gradient", {"en7": 2}),
    "q8": ("supersonic flat plate heat transfer", {"en8": 2}),
    "q9": ("轴承磨损为什么导致振动", {"zh1": 1}),
    "q10": ("叶轮气蚀噪声", {"zh2": 1}),
    "q11": ("机械密封泄漏怎么办", {"zh3": 1}),
    "q12": ("电机绕组过热原因", {"zh4": 1}),
    "q13": ("联轴器不对中轴向振动", {"zh5": 1}),
    "q14": ("润滑脂更换周期", {"zh6": 1, "zh1": 1}),
}


def _tiny_beir(root: Path) -> Path:
    d = root / "tiny-pumps"
    (d / "qrels").mkdir(parents=True)
    with (d / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for i, (title, text) in TINY_DOCS.items():
            f.write(json.dumps({"_id": i, "title": title, "text": text}, ensure_ascii=False) + "\n")
    with (d / "queries.jsonl").open("w", encoding="utf-8") as f:
        for q, (text, _) in TINY_QUERIES.items():
            f.write(json.dumps({"_id": q, "text": text}, ensure_ascii=False) + "\n")
    rows = ["query-id\tcorpus-id\tscore"]
    rows += [f"{q}\t{doc}\t{g}" for q, (_, rel) in TINY_QUERIES.items() for doc, g in rel.items()]
    (d / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return d


def test_compare_retrieval_end_to_end_on_a_tiny_bilingual_folder(tmp_path: Path) -> None:
    from context_core.config import get_settings
    from evaluation.retrieval_compare import MODES, compare_retrieval

    settings = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=None
    )
    folder = _tiny_beir(tmp_path)
    run = compare_retrieval(folder, settings, k=3, n_boot=50, seed=0, progress=False)

    assert run.dataset == "tiny-pumps" and run.n_docs == 14 and run.n_queries == 14
    assert set(run.modes) | set(run.skipped_modes) == set(MODES)
    assert "dense" in run.modes
    for r in run.modes.values():
        assert len(r.query_ids) == 14
        for metric in ("ndcg", "recall", "mrr"):
            assert 0.0 <= r.mean[metric] <= 1.0
            assert r.ci[metric].low <= r.mean[metric] + 1e-12
            assert r.mean[metric] - 1e-12 <= r.ci[metric].high
        assert r.latency_ms["n"] == 14 and 0 < r.latency_ms["p50"] <= r.latency_ms["p99"]
    if "sparse" in run.modes:
        # every query shares its key words (or Han characters) with its best document
        assert run.modes["sparse"].mean["mrr"] > 0.8
        assert run.modes["hybrid"].mean["recall"] >= run.modes["dense"].mean["recall"] - 0.1
    # the confidence comparison never sees its training queries
    c = run.confidence["dense"]
    assert c.n_train_queries + c.n_test_queries == 14 and c.n_test_queries == 7
    assert c.n_test_hits == 7 * 3
    if c.auc:
        assert 0.0 <= c.auc["cosine"] <= 1.0
    assert [g.verdict for g in run.goals] != [] and all(
        g.verdict in ("PASS", "FAIL", "n/a") for g in run.goals
    )

    md = run.report["markdown"].read_text(encoding="utf-8")
    assert run.report["markdown"].name == "retrieval_tiny-pumps.md"
    assert "| dense |" in md and "## Goals (issue 14)" in md
    assert "![metrics, ROC and reliability](retrieval_tiny-pumps.png)" in md
    doc = json.loads(run.report["json"].read_text(encoding="utf-8"))
    assert doc["n_queries"] == 14 and set(doc["modes"]) == set(run.modes)
    assert doc["modes"]["dense"]["mean"]["ndcg"] == pytest.approx(run.modes["dense"].mean["ndcg"])
    assert run.report["png"].stat().st_size > 10_000
    assert not any((tmp_path / "ctx" / "scratch").iterdir())  # the scratch collection is gone


# --- the real data sets ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.realdata
def test_compare_retrieval_on_a_cranfield_subset(shared_data: Path, tmp_path: Path) -> None:
    from context_core.config import get_settings
    from evaluation.retrieval_compare import compare_retrieval

    path = shared_data / "retrieval" / "cranfield"
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"{path} is absent")
    settings = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=None
    )
    run = compare_retrieval(
        path, settings, limit_queries=40, limit_docs=300, n_boot=100, progress=False
    )
    dense = run.modes["dense"]
    assert dense.mean["recall"] > 0.3  # minilm finds Cranfield's relevant docs, imperfectly
    assert run.confidence["dense"].auc["cosine"] > 0.5
    assert run.report["markdown"].is_file()


# --- goals and the held-out discipline -----------------------------------------------------


def _mode(name: str, recall: list[float]) -> ModeResult:
    from evaluation.retrieval_compare import score_mode

    ranked = {f"q{i}": (["rel"] if r else ["other"]) for i, r in enumerate(recall)}
    qrels = {q: {"rel": 1} for q in ranked}
    return score_mode(name, ranked, qrels, [1.0] * len(recall), k=10, n_boot=50)


def test_goals_read_pass_and_fail_honestly() -> None:
    from evaluation.retrieval_compare import goals_for

    dense = _mode("dense", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0])  # recall 0.2
    hybrid = _mode("hybrid", [1, 1, 1, 0, 0, 0, 0, 0, 0, 0])  # recall 0.3: 1.5x
    ratio_goal, auc_goal = goals_for({"dense": dense, "hybrid": hybrid}, {}, n_boot=50)
    assert ratio_goal.measured == pytest.approx(1.5) and ratio_goal.verdict == "PASS"
    assert auc_goal.verdict == "n/a" and "not available" in auc_goal.note
    same = _mode("hybrid", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    assert goals_for({"dense": dense, "hybrid": same}, {}, n_boot=0)[0].verdict == "FAIL"
    assert goals_for({"dense": dense}, {}, n_boot=0)[0].verdict == "n/a"


def test_relevance_model_is_fitted_on_train_queries_only(monkeypatch) -> None:
    from context_core.knowledge.store import Hit
    from context_core.routing import relevance
    from evaluation.retrieval_compare import confidence_signal

    rng = np.random.default_rng(0)
    hits, labels = {}, {}
    for i in range(20):
        y = [1, 0, 0, 0] if i % 2 else [0, 1, 0, 0]
        scores = sorted(rng.uniform(0.2, 0.8, 4), reverse=True)
        hits[f"q{i}"] = [
            Hit(
                id=f"{i}-{j}",
                score=s,
                payload={"source": f"d{j}"},
                sparse_score=2.0 * s,
                rank=j + 1,
            )
            for j, s in enumerate(scores)
        ]
        labels[f"q{i}"] = y
    seen: list[list[float]] = []
    real_fit = relevance.RelevanceModel.fit.__func__  # type: ignore[attr-defined]

    def spy(cls, X, y, kind="logistic", **kw):
        seen.append(sorted(X[:, 0].tolist()))
        return real_fit(cls, X, y, kind, **kw)

    monkeypatch.setattr(relevance.RelevanceModel, "fit", classmethod(spy))
    c = confidence_signal("hybrid", hits, labels, {q: 5 for q in hits}, n_boot=20, seed=3)
    train, _ = split_queries(list(hits), train_share=0.5, seed=3)
    # every fit (out-of-fold and final) sees train hits only; the final one sees all of them
    train_cos = sorted(h.score for q in train for h in hits[q])
    assert seen and all(set(rows) <= set(train_cos) for rows in seen)
    assert train_cos in seen
    assert (c.n_train_queries, c.n_test_queries, c.n_test_hits) == (10, 10, 40)
    assert c.n_test_relevant == 10 and {"cosine", "p_relevant"} <= set(c.auc)
    assert set(c.operating) == {"cosine", "p_relevant"}
    for o in c.operating.values():
        assert 0.0 <= o.recall <= 1.0 and 0 <= o.n_admitted <= 40
    assert c.brier is not None and 0.0 <= c.brier <= 1.0


def test_a_mode_the_library_lacks_is_skipped_with_its_reason(tmp_path: Path, monkeypatch) -> None:
    from context_core.config import get_settings
    from evaluation import retrieval_compare as rc

    monkeypatch.setattr(rc, "_sparse_support", lambda: (None, "no sparse vectors in this test"))
    settings = get_settings(
        data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", redis_url=None
    )
    notes: list[str] = []
    run = rc.compare_retrieval(
        _tiny_beir(tmp_path), settings, k=3, modes=("dense", "hybrid"), n_boot=10,
        progress=False, log=notes.append,
    )  # fmt: skip
    assert list(run.modes) == ["dense"]
    assert run.skipped_modes == {"hybrid": "no sparse vectors in this test"}
    assert notes == ["skipping hybrid retrieval: no sparse vectors in this test"]
    assert run.goals[0].verdict == "n/a"
    md = run.report["markdown"].read_text(encoding="utf-8")
    assert "| hybrid | skipped: no sparse vectors in this test |" in md
    with pytest.raises(ValueError, match="unknown retrieval mode"):
        rc.compare_retrieval(_tiny_beir(tmp_path / "x"), settings, modes=("bm25",))


def test_hybrid_variants_name_fusion_and_feedback() -> None:
    from evaluation import retrieval_compare as rc

    assert rc._variant_settings("") == {}
    assert rc._variant_settings("rrf") == {"hybrid_fusion": "rrf"}
    assert rc._variant_settings("weighted:0") == {"hybrid_fusion": "weighted", "hybrid_feedback": 0}
    for good in ("dense", "sparse", "hybrid", "hybrid:rrf", "hybrid:weighted:5"):
        assert rc._valid_mode(good), good
    for bad in ("bm25", "dense:rrf", "hybrid:max", "hybrid:rrf:x", "hybrid:rrf:99", "sparse:0"):
        assert not rc._valid_mode(bad), bad


def test_cli_help_explains_the_outputs() -> None:
    from typer.testing import CliRunner

    from context_app.cli import app

    res = CliRunner().invoke(app, ["eval", "compare-retrieval", "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    for phrase in ("retrieval_<dataset>", "held-out", "--limit-queries", "--limit-docs", "PASS"):
        assert phrase in text


class _WordTokens:
    """A stand-in tokenizer: one token per whitespace-separated word."""

    max_tokens = 8  # 6 tokens of text per chunk after [CLS]/[SEP]

    @staticmethod
    def token_offsets(text: str) -> list[tuple[int, int]]:
        import re

        return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def test_doc_chunks_cut_on_token_boundaries_with_the_title_on_every_chunk() -> None:
    from evaluation.retrieval_compare import doc_chunks

    text = "one two three four five six seven eight nine ten eleven"
    # window 6, title 1 token (<= 6 // 4): 5 words of text per chunk
    assert doc_chunks(_WordTokens(), "T", text) == [
        "T\none two three four five",
        "T\nsix seven eight nine ten",
        "T\neleven",
    ]
    assert doc_chunks(_WordTokens(), "", "a b c") == ["a b c"]
    # a long title is cut to a quarter of the window (1 token here)
    assert doc_chunks(_WordTokens(), "Long Title Here", "x y")[0] == "Long\nx y"


def test_cli_compares_the_fp32_and_int8_encoders(tmp_path: Path) -> None:
    """`ctx eval compare-retrieval --encoders`: both backends on one folder, side by side."""
    from typer.testing import CliRunner

    from context_app.cli import app

    folder = _tiny_beir(tmp_path)
    res = CliRunner().invoke(
        app,
        ["eval", "compare-retrieval", str(folder), "--encoders", "--k", "3"],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "fp32 torch vs int8 ONNX" in text and "nDCG@3 int8" in text
    assert "14 / 14 / 14" in text  # docs / chunks / queries of the tiny folder
    assert "goal nDCG@3 within 0.01 of fp32 and mean cosine >= 0.99:" in text
    assert text.rstrip().endswith(("PASS", "FAIL"))


def test_layer_sweep_exports_each_variant_and_the_shipped_recipe_agrees_best(
    tmp_path: Path, encoder: Any
) -> None:
    """`python -m evaluation.encoder_compare --layer-sweep`: recipe 1, one variant per layer,
    then the shipped recipe, each compared with fp32 on the same texts (real exports)."""
    from evaluation.encoder_compare import layer_sweep

    rows = layer_sweep(_tiny_beir(tmp_path), encoder, limit_texts=40)
    labels = [r["FFN output kept fp32"] for r in rows]
    assert labels == [
        "none (recipe 1: every MatMul int8)",
        *(f"layer {i}" for i in range(6)),
        "layers 0-2 (recipe 2, shipped)",
    ]
    assert {r["texts"] for r in rows} == {"28"}  # 14 chunks + 14 queries
    cos = [float(r["cosine mean"]) for r in rows]
    assert all(0.95 < c <= 1.0 for c in cos) and rows[0]["gain vs recipe 1"] == "+0.0000"
    assert cos[-1] > cos[0]  # keeping the first layers' FFN outputs fp32 agrees better
