"""The calibrated relevance probability (p_relevant): fitting, selection, the file, the router.

Known answers on synthetic labels (a signal the model must recover, calibration checked on
held-out queries against the cosine-only baseline), the JSON round trip, the model binding
(a file fitted for another embedding model is refused), and the router on real parts (Redis,
Qdrant Edge, the packaged MiniLM; fixtures from test_router): hits are labelled by p_relevant
when relevance_model.json exists and by the cosine thresholds when it does not.
"""

# ruff: noqa: F811  (pytest fixtures imported from test_router are parameters here)

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_router import Env, env  # noqa: F401 (fixtures)

from context_core.config import get_settings
from context_core.knowledge.store import Hit
from context_core.routing.confidence import ConfidencePolicy, PolicySource
from context_core.routing.relevance import (
    FEATURES,
    RelevanceModel,
    hit_features,
    query_length,
    relevance_path_for,
)
from evaluation.labels import label_set_from_frame
from evaluation.relevance_calibration import (
    auc_score,
    brier_score,
    fit_relevance,
    query_folds,
    write_relevance_model,
)


def _synthetic(n_queries: int = 300, k: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Top-k lists where relevance depends on the cosine AND the sparse score: cosine alone
    separates the classes only partly, the two together much better."""
    rng = np.random.default_rng(seed)
    qid = np.repeat(np.arange(n_queries), k)
    rank = np.tile(np.arange(1, k + 1), n_queries).astype(float)
    cos = np.sort(rng.uniform(0.3, 0.8, (n_queries, k)), axis=1)[:, ::-1].ravel()
    sparse = rng.exponential(6.0, n_queries * k)
    qlen = np.repeat(rng.integers(2, 15, n_queries), k).astype(float)
    margin = np.r_[cos[:-1] - cos[1:], 0.0]
    margin[k - 1 :: k] = 0.0
    z = 6.0 * (cos - 0.55) + 1.6 * (np.log1p(sparse) - 1.8)
    y = (rng.random(len(z)) < 1 / (1 + np.exp(-z))).astype(int)
    X = np.c_[cos, sparse, rank, margin, qlen]
    return {"X": X, "y": y, "qid": qid}


def _frame(d: dict[str, np.ndarray], features: bool = True) -> Any:
    import pandas as pd

    X = d["X"]
    frame = pd.DataFrame(
        {
            "query_id": [f"q{q}" for q in d["qid"]],
            "query": [f"question {q}" for q in d["qid"]],
            "point_id": [f"p{i}" for i in range(len(X))],
            "similarity": X[:, 0],
            "label": d["y"],
        }
    )
    if features:
        for j, name in enumerate(FEATURES[1:], start=1):
            frame[name] = X[:, j]
    return frame


# --- the model ----------------------------------------------------------------------------------


def test_logistic_recovers_a_known_signal_and_beats_cosine_on_held_out_rows() -> None:
    train, test = _synthetic(seed=1), _synthetic(seed=2)
    model = RelevanceModel.fit(train["X"], train["y"])
    assert model.features == FEATURES  # every column varies: all used
    w = dict(zip(model.features, model.coef, strict=True))
    assert w["cosine"] > 0.5 and w["sparse_score"] > 0.5  # the two real signals
    assert abs(w["query_len"]) < 0.2 and abs(w["rank"]) < w["cosine"]  # noise stays small
    p = model.predict(test["X"])
    assert ((p >= 0) & (p <= 1)).all()
    assert auc_score(p, test["y"]) > auc_score(test["X"][:, 0], test["y"]) + 0.05
    iso = RelevanceModel.fit(train["X"], train["y"], "isotonic")
    assert brier_score(p, test["y"]) < brier_score(iso.predict(test["X"]), test["y"]) - 0.01


def test_logistic_is_monotone_in_cosine_even_when_the_data_says_otherwise() -> None:
    d = _synthetic(seed=3)
    grid = np.tile(d["X"][0], (50, 1))
    grid[:, 0] = np.linspace(-0.2, 1.0, 50)
    p = RelevanceModel.fit(d["X"], d["y"]).predict(grid)
    assert (np.diff(p) > 0).all()
    # Labels that fall with the cosine: the cosine weight is fixed at 0, not negative.
    flipped = RelevanceModel.fit(d["X"] * [-1, 1, 1, 1, 1], d["y"])
    assert flipped.coef[0] == 0.0
    assert flipped.provenance["constraints"] == ["cosine weight fitted negative; fixed at 0"]
    assert (np.diff(flipped.predict(grid * [-1, 1, 1, 1, 1])) >= 0).all()


def test_isotonic_is_a_monotone_map_of_the_cosine() -> None:
    d = _synthetic(seed=4)
    iso = RelevanceModel.fit(d["X"], d["y"], "isotonic")
    assert iso.features == ("cosine",)
    grid = np.zeros((200, len(FEATURES)))
    grid[:, 0] = np.linspace(0.0, 1.0, 200)
    p = iso.predict(grid)
    assert (np.diff(p) >= 0).all() and p.min() >= 0 and p.max() <= 1
    # tiny known case: pool-adjacent-violators averages the violating pair
    X = np.zeros((4, len(FEATURES)))
    X[:, 0] = [0.1, 0.2, 0.3, 0.4]
    tiny = RelevanceModel.fit(X, [0, 1, 0, 1], "isotonic")
    assert tiny.predict(X).tolist() == [0.0, 0.5, 0.5, 1.0]


def test_constant_and_absent_features_are_left_out() -> None:
    d = _synthetic(seed=5)
    X = d["X"].copy()
    X[:, 1] = 0.0  # no sparse search behind these labels
    m = RelevanceModel.fit(X, d["y"])
    assert "sparse_score" not in m.features
    assert m.provenance["dropped_constant"] == ["sparse_score"]
    only = RelevanceModel.fit(X, d["y"], features=("cosine",))
    assert only.features == ("cosine",)
    # predict always takes the full feature matrix; the unused columns do not matter
    Y = X.copy()
    Y[:, 1:] = 123.0
    assert np.allclose(only.predict(X), only.predict(Y))


def test_json_round_trip_and_malformed_documents() -> None:
    d = _synthetic(seed=6)
    for kind in ("logistic", "isotonic"):
        m = (
            RelevanceModel.fit(d["X"], d["y"], kind)
            .with_thresholds(0.6, 0.2)
            .with_provenance(model="minilm", dataset="synthetic")
        )
        doc = json.loads(json.dumps(m.to_dict()))
        back = RelevanceModel.from_dict(doc)
        assert np.allclose(back.predict(d["X"]), m.predict(d["X"]))
        assert (back.kind, back.accept, back.skip, back.model) == (kind, 0.6, 0.2, "minilm")
        assert doc["model"] == "minilm" and doc["features"] == list(m.features)
    good = RelevanceModel.fit(d["X"], d["y"]).with_thresholds(0.6, 0.2).to_dict()
    for change, problem in (
        ({"format": 9}, '"format"'),
        ({"kind": "forest"}, '"kind"'),
        ({"features": ["rank", "cosine"]}, '"features"'),
        ({"accept": None}, '"accept" and "skip"'),
        ({"params": {**good["params"], "scale": [0.0] * 5}}, "scale > 0"),
        ({"accept": 0.1, "skip": 0.5}, "skip <= accept"),
    ):
        with pytest.raises(ValueError, match=problem):
            RelevanceModel.from_dict({**good, **change})


def test_hit_features_defaults_without_sparse_fields() -> None:
    hits = [Hit("a", 0.8, {}), Hit("b", 0.7, {}), Hit("c", 0.65, {})]
    X = hit_features(hits, 7)
    assert X.shape == (3, len(FEATURES))
    assert X[:, 1].tolist() == [0.0, 0.0, 0.0]  # sparse_score None -> 0.0
    assert X[:, 2].tolist() == [1.0, 2.0, 3.0]  # rank None -> position + 1
    assert np.allclose(X[:, 3], [0.1, 0.05, 0.0])  # margin to the next, 0 for the last
    assert X[:, 4].tolist() == [7.0, 7.0, 7.0]
    assert hit_features([], 3).shape == (0, len(FEATURES))
    assert query_length("how much vibration is too much for a pump") > 0
    m = RelevanceModel.fit(*_xy_cosine_only())
    p = m.predict_hits([Hit("x", float("nan"), {}), *hits], 7)
    assert p[0] == 0.0 and all(0 < v < 1 for v in p[1:])  # NaN never trusted


def _xy_cosine_only() -> tuple[np.ndarray, np.ndarray]:
    d = _synthetic(seed=7)
    return d["X"], d["y"]


def test_relevance_file_sits_next_to_its_thresholds() -> None:
    assert relevance_path_for(Path("r/thresholds.json")) == Path("r/relevance_model.json")
    assert relevance_path_for(Path("r/thresholds_cranfield.json")) == Path(
        "r/relevance_model_cranfield.json"
    )
    assert relevance_path_for(Path("x/mine.json")) == Path("x/mine.relevance_model.json")


# --- fitting from labels (selection on held-out queries) ----------------------------------------


def test_fit_relevance_selects_by_held_out_brier_and_is_calibrated() -> None:
    d = _synthetic(n_queries=400, seed=8)
    labels = label_set_from_frame(_frame(d))
    fit = fit_relevance(labels, model="minilm", dataset="synthetic", n_boot=50, seed=0)
    assert fit.kind == "logistic"  # the sparse score carries signal the cosine lacks
    sel = fit.selection
    assert sel["logistic"]["brier"] < sel["isotonic"]["brier"] - 0.01
    assert sel["logistic"]["auc"] > auc_score(d["X"][:, 0], d["y"]) + 0.05
    # held-out reliability: each well-filled bin's observed rate is close to its prediction
    for b in fit.summary()["reliability"]["p_relevant"]:
        if b["n"] >= 150:
            assert abs(b["observed"] - b["mean_p"]) < 0.08, b
    m = fit.model
    assert 0 <= m.skip <= m.accept <= 1  # type: ignore[operator]
    assert (m.accept, m.skip) == (fit.thresholds.accept, fit.thresholds.skip)
    prov = m.provenance
    assert prov["model"] == "minilm" and prov["n"] == len(d["y"])
    assert prov["positives"] == int(d["y"].sum()) and prov["features_missing"] == []
    assert prov["chosen_by"].startswith("lowest held-out Brier")
    assert prov["retrieval_mode"] == "hybrid"  # the labels carry sparse scores


def test_folds_keep_each_query_whole() -> None:
    groups = np.repeat([f"q{i}" for i in range(23)], 5)
    folds = query_folds(groups, 5, seed=1)
    for q in np.unique(groups):
        assert len(set(folds[groups == q])) == 1
    assert set(folds) == set(range(5))


def test_cosine_only_labels_fit_a_cosine_model_and_say_so() -> None:
    d = _synthetic(seed=9)
    fit = fit_relevance(
        label_set_from_frame(_frame(d, features=False)), model="minilm", dataset="old", n_boot=0
    )
    assert fit.model.features == ("cosine",)
    assert fit.missing == ("sparse_score", "rank", "margin", "query_len")
    assert "uses cosine only" in fit.model.provenance["note"]
    assert fit.model.provenance["retrieval_mode"] == "dense"


# --- runtime: PolicySource ------------------------------------------------------------------------


def _installed(reports: Path, *, model: str = "minilm", accept: float = 0.5) -> Path:
    """A cosine-only logistic model whose p crosses 0.5 at cosine 0.30 (far below 0.72)."""
    m = RelevanceModel(
        kind="logistic",
        features=("cosine",),
        mean=(0.0,),
        scale=(1.0,),
        coef=(40.0,),
        intercept=-40.0 * 0.30,
        provenance={"model": model, "dataset": "test"},
    ).with_thresholds(accept, 0.2)
    return write_relevance_model(m, reports / "relevance_model.json")


def test_policy_source_loads_refuses_and_reloads_the_relevance_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    src = PolicySource(settings, model="minilm")
    assert src.relevance() is None and src.status()["relevance"] is None
    path = _installed(tmp_path / "reports")
    assert src.relevance_path == path
    m = src.relevance()
    assert m is not None and m.kind == "logistic"
    pol = src.relevance_policy()
    assert pol is not None and pol.pair == (0.5, 0.2) and str(path) in pol.source
    assert src.current().pair == (0.72, 0.65)  # the cosine thresholds stay as they were
    assert src.status()["relevance"]["in_force"] is True

    _installed(tmp_path / "reports", model="bge-m3")  # replaced: fitted for another model
    with caplog.at_level(logging.ERROR, logger="context_core.routing.confidence"):
        assert src.relevance() is None
    assert "refused" in caplog.text and "bge-m3" in caplog.text
    st = src.status()["relevance"]
    assert st["mismatch"] is True and st["file_model"] == "bge-m3" and not st["in_force"]
    warn = PolicySource(
        settings.model_copy(update={"thresholds_model_mismatch": "warn"}), model="minilm"
    )
    assert warn.relevance() is not None and warn.status()["relevance"]["mismatch"] is True

    path.write_text("{broken", encoding="utf-8")
    assert src.relevance() is None
    assert "JSON" in src.status()["relevance"]["problem"]


# --- the router on real parts ---------------------------------------------------------------------

QUERY = "how much vibration is too much for a pump"


def test_router_labels_by_p_relevant_when_the_model_file_exists(env: Env) -> None:
    settings = env.settings
    hits = env.knowledge.search(QUERY, section="PUMP", limit=5)
    top = hits[0].score
    assert 0.30 < top < 0.72  # below the cosine accept; above the model's 50 % point
    src = PolicySource(settings, model=env.knowledge.encoder.name)
    with env.router(policy=src) as router:
        before = router.route(env.state(), "default", params={"query": QUERY})
        _installed(settings.reports_dir)
        after = router.route(env.state(), "default", params={"query": QUERY})
    assert "confident" not in {f.label for f in before.by_layer("L3")}
    assert all(
        f.confidence_signal == "cosine" and f.p_relevant is None for f in before.by_layer("L3")
    )

    first = after.by_layer("L3")[0]
    assert first.label == "confident" and first.confidence_signal == "p_relevant"
    assert first.p_relevant is not None and first.p_relevant >= 0.5
    assert first.relevance == round(top, 4)  # relevance/confidence stay the cosine
    wire = after.to_dict()["fragments"]
    assert any(f["confidence_signal"] == "p_relevant" for f in wire)

    rec_before, rec_after = env.traces()
    assert rec_before["l3"]["confidence_signal"] == "cosine"
    assert "relevance" not in rec_before["confidence"]
    assert all("p_relevant" not in h for h in rec_before["l3"]["hits"])
    assert rec_after["l3"]["confidence_signal"] == "p_relevant"
    rel = rec_after["confidence"]["relevance"]
    assert (rel["accept"], rel["skip"], rel["kind"], rel["model"]) == (
        0.5,
        0.2,
        "logistic",
        "minilm",
    )
    assert rec_after["confidence"]["accept"] == 0.72  # the cosine pair is still recorded
    for h, lab in zip(rec_after["l3"]["hits"], ("confident",), strict=False):
        assert h["label"] == lab and h["p_relevant"] >= 0.5


def test_router_without_a_model_file_labels_by_cosine_unchanged(env: Env) -> None:
    hits = env.knowledge.search(QUERY, section="PUMP", limit=5)
    src = PolicySource(env.settings, model=env.knowledge.encoder.name)
    with env.router(policy=src) as router:
        b = router.route(env.state(), "default", params={"query": QUERY})
    (rec,) = env.traces()
    expected = ConfidencePolicy().label_hits([h["score"] for h in rec["l3"]["hits"]])
    assert [h["label"] for h in rec["l3"]["hits"]] == expected
    assert rec["l3"]["confidence_signal"] == "cosine"
    assert rec["confidence"] == ConfidencePolicy.defaults(env.settings).to_dict()
    assert all(f.confidence_signal == "cosine" for f in b.by_layer("L3"))
    assert len(hits) > 0


def test_router_refuses_a_relevance_model_of_another_embedding_model(env: Env) -> None:
    _installed(env.settings.reports_dir, model="bge-m3")
    src = PolicySource(env.settings, model=env.knowledge.encoder.name)
    with env.router(policy=src) as router:
        b = router.route(env.state(), "default", params={"query": QUERY})
    assert "confident" not in {f.label for f in b.by_layer("L3")}
    (rec,) = env.traces()
    assert rec["l3"]["confidence_signal"] == "cosine"


# --- the CLI writes the model next to the thresholds ---------------------------------------------


def _write_csv(path: Path, frame: Any) -> Path:
    frame.to_csv(path, index=False, quoting=csv.QUOTE_MINIMAL)
    return path


def test_cli_calibrate_writes_the_relevance_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    from typer.testing import CliRunner

    from context_app.cli import app

    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("CTX_REDIS_URL", redis_url)
    d = _synthetic(n_queries=120, seed=10)
    runner = CliRunner()
    res = runner.invoke(
        app, ["eval", "calibrate", str(_write_csv(tmp_path / "l.csv", _frame(d))), "--n-boot", "20"]
    )
    assert res.exit_code == 0, res.output
    assert "p_relevant: logistic" in res.output
    reports = tmp_path / "reports"
    doc = json.loads((reports / "relevance_model.json").read_text())
    assert doc["model"] == "minilm" and doc["kind"] == "logistic"
    assert doc["features"] == list(FEATURES)
    assert doc["provenance"]["labels_sha256"] and doc["provenance"]["n"] == len(d["y"])
    loaded = RelevanceModel.from_dict(doc)
    assert loaded.accept == doc["accept"]
    md = (reports / "calibration_report.md").read_text()
    assert "p_relevant" in md and "![reliability diagram]" in md and "Brier" in md
    js = json.loads((reports / "calibration_report.json").read_text())
    held = js["relevance"]["held_out"]
    assert held["brier_p_relevant"] < held["brier_cosine"]
    assert (reports / "calibration_reliability.png").stat().st_size > 1000
    # the router's PolicySource picks it up for this model
    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=reports)
    assert PolicySource(settings, model="minilm").relevance() is not None

    # an old labels file (cosine only) still works; --out elsewhere keeps the runtime file
    old = _frame(d, features=False)
    res = runner.invoke(
        app,
        ["eval", "calibrate", str(_write_csv(tmp_path / "old.csv", old)), "--n-boot", "50",
         "--out", str(reports / "thresholds_old.json")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    # a cosine-only model cannot beat the cosine's AUC (gate p_relevant): not kept
    assert "p_relevant: logistic over cosine" in res.output
    assert "gate note p_relevant" in res.output and "carries no model" in res.output
    assert (reports / "thresholds_old.json").is_file()
    assert not (reports / "relevance_model_old.json").exists()
    js_old = json.loads((reports / "calibration_report.json").read_text())
    assert js_old["relevance"]["features_missing"] == ["sparse_score", "rank", "margin",
                                                     "query_len"]  # fmt: skip
    assert json.loads((reports / "relevance_model.json").read_text())["params"] == doc["params"]

    res = runner.invoke(
        app, ["eval", "calibrate", str(tmp_path / "old.csv"), "--n-boot", "50", "--no-relevance"]
    )
    assert res.exit_code == 0, res.output
    assert not any(line.startswith("p_relevant:") for line in res.output.splitlines())
    # the version promoted has no model, so none is in force any more
    assert not (reports / "relevance_model.json").exists()


def test_labels_reject_bad_feature_values_naming_rows(tmp_path: Path) -> None:
    from context_core.errors import DataValidationError
    from evaluation.labels import load_labels

    d = _synthetic(n_queries=10, seed=11)
    frame = _frame(d)
    frame.loc[4, "rank"] = 0
    frame.loc[6, "sparse_score"] = -1.0
    with pytest.raises(DataValidationError) as e:
        load_labels(_write_csv(tmp_path / "bad.csv", frame))
    text = "\n".join(e.value.failures)
    assert "row 5 (query_id=q0, point_id=p4): rank must be a number >= 1" in text
    assert "row 7 (query_id=q0, point_id=p6): sparse_score must be a number >= 0" in text


# --- calibrate-beir on real judgements ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.realdata
def test_calibrate_beir_fits_p_relevant_on_hybrid_hits(shared_data: Path, settings) -> None:
    from evaluation.beir import calibrate_beir

    path = shared_data / "retrieval" / "cranfield"
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"{path} is absent")
    run = calibrate_beir(
        path, settings, k=10, limit_queries=40, limit_docs=300, n_boot=100, progress=False,
        mode="hybrid", install=True,
    )  # fmt: skip
    assert run.relevance is not None and run.relevance_path is not None
    assert run.relevance_path.name == "relevance_model_cranfield.json"
    # promoted with the model only when it beat raw cosine on held-out queries (gate p_relevant)
    assert run.staged is not None and run.staged.promoted
    kept = {g.name: g for g in run.staged.gates.gates}["p_relevant"].passed
    held = run.relevance.summary()["held_out"]
    assert kept == (held["auc_p_relevant"] > held["auc_cosine"])
    runtime_model = settings.reports_dir / "relevance_model.json"
    assert run.relevance_installed == (runtime_model if kept else None)
    assert runtime_model.exists() == kept
    doc = json.loads(run.relevance_path.read_text())
    assert doc["model"] == "minilm" and doc["provenance"]["retrieval_mode"] == "hybrid"
    # hybrid hits carry every feature; the choice among the three candidates is recorded
    assert doc["provenance"]["features_missing"] == []
    assert set(doc["provenance"]["selection"]) == {"logistic", "logistic_cosine", "isotonic"}
    assert doc["provenance"]["candidate"] in doc["provenance"]["selection"]
    frame = run.labels.frame
    assert frame["sparse_score"].notna().any() and frame["rank"].between(1, 10).all()
    src = PolicySource(settings, model="minilm")
    assert (src.relevance() is not None) == kept  # in force next to the runtime thresholds
    md = run.report["markdown"].read_text()
    assert "## Calibrated relevance probability (p_relevant)" in md
