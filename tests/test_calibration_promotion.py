"""Gated promotion of calibrations: candidates, gates, versions, rollback, shadow (issue 39).

The CLI runs for real (typer's runner on the `ctx` app, real files under a temp reports dir);
the router tests use real Redis, Qdrant Edge and the packaged MiniLM model (fixtures from
test_router) and the runtime's own reload-on-change.
"""

# ruff: noqa: F811  (pytest fixtures imported from test_router are parameters here)

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_router import Env, env  # noqa: F401 (fixtures)

from context_core.config import get_settings
from context_core.errors import DataValidationError, PromotionError
from context_core.routing.confidence import PolicySource
from evaluation.calibration import calibrate
from evaluation.label_quality import check_label_quality, load_checked_labels
from evaluation.labels import label_set_from_frame
from evaluation.promotion import InForce, VersionStore, evaluate_gates
from evaluation.shadow import shadow_report, start_shadow, stop_shadow

COLS = ["query_id", "query", "point_id", "similarity", "label"]


def _rows(n_q: int, per_q: int, *, signal: float, seed: int, pos: float = 0.4) -> list[dict]:
    """Labelled hits; ``signal`` is how much higher a relevant hit scores (0: uncorrelated)."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_q):
        for k in range(per_q):
            label = int(rng.random() < pos)
            sim = float(np.clip(0.55 + signal * label + rng.normal(0, 0.07), -1, 1))
            rows.append({"query_id": f"q{q}", "query": f"query {q}", "point_id": f"p{q}-{k}",
                         "similarity": round(sim, 4), "label": label})  # fmt: skip
    return rows


def _csv(path: Path, rows: list[dict], extra: tuple[str, ...] = ()) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*COLS, *extra])
        w.writeheader()
        w.writerows(rows)
    return path


def _labels(rows: list[dict]) -> Any:
    return label_set_from_frame(pd.DataFrame(rows), min_rows=1)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> Any:
    from typer.testing import CliRunner

    from context_app.cli import app

    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "ctx"))
    monkeypatch.setenv("CTX_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("CTX_REDIS_URL", redis_url)
    runner = CliRunner()

    def run(args: list[str]) -> Any:
        return runner.invoke(app, args)

    return run


# --- the scenario -------------------------------------------------------------------


def test_tiny_uncorrelated_labels_do_not_replace_the_calibration_in_force(
    cli: Any, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    good = cli(["eval", "calibrate", str(_csv(tmp_path / "good.csv",
               _rows(27, 10, signal=0.15, seed=1))), "--n-boot", "200"])  # fmt: skip
    assert good.exit_code == 0, good.output
    assert "PROMOTED c-" in good.output
    in_force = (reports / "thresholds.json").read_bytes()
    version = (reports / "calibrations" / "current").read_text().strip()

    # 4 queries x 5 hits, labels that have nothing to do with the similarity
    bad_rows = _rows(4, 5, signal=0.0, seed=2)
    bad = cli(["eval", "calibrate", str(_csv(tmp_path / "bad.csv", bad_rows)), "--n-boot", "200"])
    assert bad.exit_code == 1, bad.output
    assert "NOT PROMOTED: gate(s) failed: labels_per_class, auc_ci" in bad.output
    assert "FAIL labels_per_class" in bad.output and "FAIL auc_ci" in bad.output
    assert (reports / "thresholds.json").read_bytes() == in_force
    assert (reports / "calibrations" / "current").read_text().strip() == version
    # the candidate is kept, with its provenance, for inspection
    store = VersionStore(reports / "thresholds.json")
    cand = store.get(store.ids()[-1])
    assert cand.id != version
    assert cand.provenance["rows"] == 20 and cand.provenance["gates"]["failed"] == [
        "labels_per_class", "auc_ci"
    ]  # fmt: skip
    assert cand.provenance["labels_sha256"] and cand.provenance["ran_by"]
    assert "NOT PROMOTED" in (reports / "calibration_report.md").read_text()


def test_force_promotes_and_records_the_reason(cli: Any, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    path = _csv(tmp_path / "small.csv", _rows(4, 5, signal=0.3, seed=3))
    no_reason = cli(["eval", "calibrate", str(path), "--force"])
    assert no_reason.exit_code == 1 and "--force needs --reason" in no_reason.output
    assert not (reports / "calibrations").exists()  # checked before anything is written
    res = cli(["eval", "calibrate", str(path), "--n-boot", "50", "--force", "--reason",
              "pilot on 20 labels, approved by the team lead"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "forced past: labels_per_class" in res.output
    store = VersionStore(reports / "thresholds.json")
    v = store.get(store.current_id() or "")
    (promotion,) = v.provenance["promotions"]
    assert promotion["forced"] is True
    assert promotion["reason"] == "pilot on 20 labels, approved by the team lead"
    assert store.history()[-1]["reason"] == promotion["reason"]


# --- each gate, failing and passing -----------------------------------------------------------


def _gates(rows: list[dict], in_force: InForce | None = None, **kw: Any) -> dict[str, Any]:
    labels = _labels(rows)
    result = kw.pop("result", None) or calibrate(labels.scores, labels.labels, n_boot=200)
    rep = evaluate_gates(
        result, kw.pop("fit", None), labels, in_force or InForce(None, None, None),
        min_per_class=kw.pop("min_per_class", 30), margin=0.05, n_boot=200,
    )  # fmt: skip
    return {g.name: g for g in rep.gates} | {"_report": rep}


def test_gate_labels_per_class() -> None:
    rows = _rows(10, 10, signal=0.2, seed=4)
    n_pos = sum(r["label"] for r in rows)
    n_neg = len(rows) - n_pos
    smaller = min(n_pos, n_neg)
    assert _gates(rows, min_per_class=smaller)["labels_per_class"].passed
    failing = _gates(rows, min_per_class=smaller + 1)
    assert not failing["labels_per_class"].passed
    assert failing["_report"].failed == ["labels_per_class"]


def test_gate_auc_ci() -> None:
    assert _gates(_rows(20, 10, signal=0.15, seed=5))["auc_ci"].passed
    g = _gates(_rows(20, 10, signal=0.0, seed=6))["auc_ci"]
    assert not g.passed and g.values["ci_low"] <= 0.5 < g.values["ci_high"]
    labels = _labels(_rows(20, 10, signal=0.15, seed=5))
    no_ci = calibrate(labels.scores, labels.labels, n_boot=0)
    g = _gates(_rows(20, 10, signal=0.15, seed=5), result=no_ci)["auc_ci"]
    assert not g.passed and "--n-boot" in g.detail


def test_gate_not_worse_paired_bootstrap() -> None:
    rows = _rows(20, 10, signal=0.15, seed=7)
    labels = _labels(rows)
    good = calibrate(labels.scores, labels.labels, n_boot=50)
    in_force = InForce("c-x", {"accept": good.accept, "skip": good.skip}, None)
    same = _gates(rows, in_force, result=good)["not_worse"]
    assert same.passed and same.values["diff"] == 0.0 and same.values["ci_low"] == 0.0
    # a candidate that admits nothing is clearly worse than the one in force
    worse = dataclasses.replace(good, accept=0.99, skip=0.98)
    g = _gates(rows, in_force, result=worse)["not_worse"]
    assert not g.passed and g.values["ci_high"] < -0.05
    # nothing in force: passes, says so
    assert _gates(rows, result=good)["not_worse"].passed


def test_gate_p_relevant_keeps_the_model_only_when_it_beats_cosine() -> None:
    from evaluation.relevance_calibration import fit_relevance

    rng = np.random.default_rng(8)
    rows = _rows(40, 8, signal=0.03, seed=8)
    for r in rows:  # the rank carries most of the signal
        r["rank"] = 1 if r["label"] and rng.random() < 0.8 else int(rng.integers(2, 9))
    labels = label_set_from_frame(pd.DataFrame(rows), min_rows=1)
    fit = fit_relevance(labels, model="minilm", dataset="t", n_boot=0)
    g = _gates(rows, fit=fit)
    held = fit.summary()["held_out"]
    assert held["auc_p_relevant"] > held["auc_cosine"]
    assert g["p_relevant"].passed and g["_report"].keep_relevance
    # cosine only: the model is a monotone map of the cosine, never better; not kept
    plain = [{k: v for k, v in r.items() if k != "rank"} for r in rows]
    fit2 = fit_relevance(_labels(plain), model="minilm", dataset="t", n_boot=0)
    g2 = _gates(plain, fit=fit2)
    assert not g2["p_relevant"].passed and not g2["_report"].keep_relevance
    assert not g2["p_relevant"].blocking and "p_relevant" not in g2["_report"].failed


def test_gate_label_change_is_reported_not_blocking() -> None:
    rows = _rows(20, 10, signal=0.15, seed=9)
    labels = _labels(rows)
    res = calibrate(labels.scores, labels.labels, n_boot=50)
    g = _gates(rows, InForce("c-x", {"accept": 0.9, "skip": 0.8}, None), result=res)
    s = np.asarray(labels.scores)
    old = np.where(s >= 0.9, 2, np.where(s >= 0.8, 1, 0))
    new = np.where(s >= res.accept, 2, np.where(s >= res.skip, 1, 0))
    assert g["label_change"].values["changed_share"] == pytest.approx((old != new).mean())
    assert not g["label_change"].blocking


# --- versions, promote, rollback on a running router ------------------------------------------


def _version(store: VersionStore, accept: float, skip: float, sha: str) -> str:
    doc = {"accept": accept, "skip": skip, "model": "minilm"}
    return store.create(doc, None, {"labels_sha256": sha * 32}).id


def test_rollback_restores_the_previous_version_in_a_running_router(env: Env) -> None:
    settings = env.settings
    store = VersionStore.for_settings(settings)
    query = "how much vibration is too much for a pump"
    top = env.knowledge.search(query, section="PUMP", limit=3)[0].score
    strict = _version(store, 0.99, 0.2, "aa")  # nothing confident
    loose = _version(store, round(top - 0.05, 4), 0.1, "bb")  # the top hit confident
    store.promote(strict, by="test")
    src = PolicySource(settings, model=env.knowledge.encoder.name)
    with env.router(policy=src) as router:
        b1 = router.route(env.state(), "default", params={"query": query})
        store.promote(loose, by="test")
        b2 = router.route(env.state(), "default", params={"query": query})
        back = store.rollback(by="test", reason="CER dropped")
        b3 = router.route(env.state(), "default", params={"query": query})
    assert back.id == strict
    labels = [{f.label for f in b.by_layer("L3")} for b in (b1, b2, b3)]
    assert "confident" not in labels[0] and "confident" in labels[1]
    assert "confident" not in labels[2]
    versions = [t["confidence"]["version"] for t in env.traces()]
    assert versions == [strict, loose, strict]
    assert [h["action"] for h in store.history()] == ["promote", "promote", "rollback"]
    with pytest.raises(PromotionError, match="first calibration promoted"):
        store.rollback(by="test")


def test_versions_made_in_the_same_second_list_in_the_order_they_were_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt

    import evaluation.promotion as promotion

    fixed = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    monkeypatch.setattr(promotion, "_now", lambda: fixed)
    store = VersionStore(tmp_path / "reports" / "thresholds.json")
    made = [_version(store, 0.7, 0.5, sha) for sha in ("ff", "00", "ff", "11")]
    assert len(set(made)) == 4
    assert store.ids() == made  # not by label hash: "00" was made after "ff"


def test_legacy_thresholds_in_force_become_a_version_that_can_be_rolled_back_to(
    tmp_path: Path,
) -> None:
    settings = get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")
    path = settings.resolved_thresholds_path
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"accept": 0.6, "skip": 0.4, "model": "minilm"}))
    store = VersionStore.for_settings(settings)
    v = _version(store, 0.7, 0.5, "cc")
    store.promote(v, by="test")
    assert json.loads(path.read_text())["version"] == v
    legacy = store.rollback(by="test")
    assert legacy.id.startswith("legacy-")
    assert json.loads(path.read_text())["accept"] == 0.6
    with pytest.raises(PromotionError, match="not a calibration version"):
        store.get("../etc")


def test_cli_thresholds_list_show_promote_rollback(cli: Any, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    for seed in (10, 11):
        res = cli(["eval", "calibrate", str(_csv(tmp_path / f"l{seed}.csv",
                  _rows(27, 10, signal=0.15, seed=seed))), "--n-boot", "100"])  # fmt: skip
        assert res.exit_code == 0, res.output
    store = VersionStore(reports / "thresholds.json")
    first, second = store.ids()
    listed = cli(["eval", "thresholds", "list"])
    assert listed.exit_code == 0 and first in listed.output and second in listed.output
    shown = json.loads(cli(["eval", "thresholds", "show"]).output)
    assert shown["version"] == second and shown["in_force"] is True
    assert shown["provenance"]["class_counts"]["relevant"] > 30
    res = cli(["eval", "thresholds", "rollback", "--reason", "drill"])
    assert res.exit_code == 0 and f"ROLLED BACK {second} -> {first}" in res.output
    assert json.loads((reports / "thresholds.json").read_text())["version"] == first
    res = cli(["eval", "thresholds", "promote", second])
    assert res.exit_code == 0 and f"PROMOTED {second}" in res.output
    assert cli(["eval", "thresholds", "promote", "c-20000101T000000Z-00000000"]).exit_code == 1


# --- label quality ------------------------------------------------------------------------------


def test_label_quality_conflicts_block_duplicates_and_empty_queries_are_reported(
    tmp_path: Path,
) -> None:
    rows = _rows(6, 5, signal=0.2, seed=12)
    for r in rows:
        if r["query_id"] == "q5":
            r["label"] = 0
    rows.append(dict(rows[0]))  # exact duplicate
    q = check_label_quality(pd.DataFrame(rows))
    names = {f.name: f for f in q.findings}
    assert not names["duplicate_rows"].blocking and len(q.frame) == 30
    assert names["queries_without_positive"].rows == ("query_id=q5",)
    assert not q.blocking
    conflict = dict(rows[1], label=1 - rows[1]["label"])
    path = _csv(tmp_path / "c.csv", [*rows, conflict])
    with pytest.raises(DataValidationError, match="conflicting_labels") as e:
        load_checked_labels(path, min_rows=1)
    assert any("query_id=q0, point_id=p0-1" in f for f in e.value.failures)


def test_label_quality_kappa_per_annotator_pair(tmp_path: Path) -> None:
    base = _rows(10, 6, signal=0.2, seed=13)
    rng = np.random.default_rng(13)

    def by(name: str, flip: float) -> list[dict]:
        return [dict(r, annotator=name, label=int(r["label"] ^ (rng.random() < flip)))
                for r in base]  # fmt: skip

    agree = [*by("ann", 0.0), *by("bob", 0.05)]
    labels, q = load_checked_labels(_csv(tmp_path / "a.csv", agree, ("annotator",)), min_rows=1)
    ties = {f.name: f for f in q.findings}.get("annotator_ties")
    n_ties = len(ties.rows) if ties else 0
    assert q.kappa["ann|bob"] > 0.8 and labels.n == len(base) - n_ties  # one row per hit
    noisy = [*by("ann", 0.0), *by("bob", 0.0), *by("cy", 0.5)]
    with pytest.raises(DataValidationError, match="annotator_agreement") as e:
        load_checked_labels(_csv(tmp_path / "n.csv", noisy, ("annotator",)), min_rows=1)
    text = "\n".join(e.value.failures)
    assert "ann vs cy" in text and "bob vs cy" in text and "ann vs bob" not in text


# --- shadow ---------------------------------------------------------------------------------------


def test_shadow_labels_routes_under_the_candidate_bounded_by_route_count(
    env: Env, cli: Any
) -> None:
    settings = env.settings
    store = VersionStore.for_settings(settings)
    query = "how much vibration is too much for a pump"
    top = env.knowledge.search(query, section="PUMP", limit=3)[0].score
    strict = _version(store, 0.99, 0.2, "dd")
    loose = _version(store, round(top - 0.05, 4), 0.1, "ee")
    store.promote(strict, by="test")
    with pytest.raises(PromotionError, match="in force"):
        start_shadow(store, strict, routes=2)
    res = cli(["eval", "thresholds", "shadow", loose, "--minutes", "30"])
    assert res.exit_code == 0 and f"SHADOW {loose}" in res.output
    assert json.loads(store.shadow_file.read_text())["until"] is not None
    res = cli(["eval", "thresholds", "shadow", loose, "--routes", "2"])
    assert res.exit_code == 0 and "2 routes per process" in res.output
    assert json.loads(store.shadow_file.read_text())["max_routes"] == 2
    src = PolicySource(settings, model=env.knowledge.encoder.name)
    with env.router(policy=src) as router:
        bundles = [router.route(env.state(), "default", params={"query": query})
                   for _ in range(3)]  # fmt: skip
    # what the agent got is the calibration in force
    assert all("confident" not in {f.label for f in b.by_layer("L3")} for b in bundles)
    recs = env.traces()
    shadows = [r["confidence"].get("shadow") for r in recs]
    assert shadows[2] is None  # bounded: 2 routes
    for r, sh in zip(recs[:2], shadows[:2], strict=True):
        assert sh["version"] == loose and r["confidence"]["version"] == strict
        assert sh["labels"][0] == "confident" and r["l3"]["hits"][0]["label"] != "confident"
    rep = shadow_report(settings.traces_dir)
    assert rep.version == loose and rep.n_routes == 2 and rep.n_changed >= 2
    assert any(t.endswith("->confident") for t in rep.transitions)
    assert rep.cer_in_force.n_loaded == 0 and rep.cer_shadow.n_loaded == 2
    res = cli(["eval", "thresholds", "shadow-report"])
    assert res.exit_code == 0, res.output
    assert f"shadow {loose}: 2 routes" in res.output and "loaded 0" in res.output
    shown = json.loads(cli(["eval", "thresholds", "show", loose]).output)
    assert shown["version"] == loose and shown["in_force"] is False
    assert cli(["eval", "thresholds", "shadow-stop"]).output.strip() == "shadow stopped"
    assert not stop_shadow(store)


# --- a running HTTP service ---------------------------------------------------------------------


def test_rollback_reaches_a_running_service_without_a_restart(
    tmp_path: Path, redis_url: str, session_id: str
) -> None:
    import httpx
    from test_service import cleanup_service_keys, running_service, service_settings

    from context_core.traces import read_traces

    settings, keys = service_settings(tmp_path, redis_url)
    store = VersionStore.for_settings(settings)
    first = _version(store, 0.61, 0.41, "f1")
    second = _version(store, 0.52, 0.32, "f2")
    store.promote(first, by="test")

    def info(c: httpx.Client) -> tuple[str, str]:
        text = c.get("/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("ctx_confidence_thresholds_info{"))
        accept = next(x for x in text.splitlines()
                      if x.startswith('ctx_confidence_threshold{bound="accept"}'))  # fmt: skip
        return line.split('version="')[1].split('"')[0], accept.rsplit(" ", 1)[1]

    try:
        with (
            running_service(settings) as url,
            httpx.Client(base_url=url, headers={"X-API-Key": keys["agent-a"]}, timeout=30) as c,
        ):
            body = {"session_id": session_id, "user_id": "u-1", "user_query": "pump vibration"}
            state = c.post("/v1/sessions", json=body).json()["state"]

            def route() -> None:
                r = c.post("/v1/context", json={"session_id": session_id,
                           "step_intent": "default", "state": state})  # fmt: skip
                assert r.status_code == 200, r.text

            route()
            assert info(c) == (first, "0.61")
            store.promote(second, by="test")
            route()
            assert info(c) == (second, "0.52")
            store.rollback(by="test", reason="drill")
            route()
            assert info(c) == (first, "0.61")
    finally:
        cleanup_service_keys(redis_url)
    versions = [r["confidence"]["version"] for r in read_traces(settings.traces_dir, kind="route")]
    assert versions == [first, second, first]


def test_a_malformed_file_in_force_does_not_block_the_first_good_calibration(
    cli: Any, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "thresholds.json").write_text('{"accept": "high"}')
    res = cli(["eval", "calibrate", str(_csv(tmp_path / "g.csv",
               _rows(27, 10, signal=0.15, seed=14))), "--n-boot", "100"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "no numeric accept/skip" in res.output
    assert isinstance(json.loads((reports / "thresholds.json").read_text())["accept"], float)
    assert not any(v.startswith("legacy-") for v in VersionStore(reports / "thresholds.json").ids())


def test_concurrent_promotions_keep_a_whole_history(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = VersionStore(tmp_path / "reports" / "thresholds.json")
    ids = [_version(store, 0.5 + i / 100, 0.3, f"{i:02x}") for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda v: store.promote(v, by="test"), ids))
    history = store.history()
    assert sorted(h["version"] for h in history) == sorted(ids)
    # each promotion saw the one before it: the previous versions chain through the history
    assert [h["previous"] for h in history[1:]] == [h["version"] for h in history[:-1]]
    assert store.current_id() == history[-1]["version"]
    in_force = json.loads((tmp_path / "reports" / "thresholds.json").read_text())
    assert in_force["version"] == store.current_id()
