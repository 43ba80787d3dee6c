"""Threshold calibration: known answers on synthetic and hand-made scores."""

from __future__ import annotations

import json

import numpy as np
import pytest

from context_core.errors import CalibrationError
from context_core.routing.confidence import ConfidencePolicy, label_score
from evaluation.calibration import (
    Provenance,
    calibrate,
    compare_with_current,
    write_thresholds,
)


def _separable(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0.75, 1.0, 300)
    neg = rng.uniform(0.0, 0.70, 400)
    return np.r_[pos, neg], np.r_[np.ones(300, int), np.zeros(400, int)]


def test_youden_recovers_a_known_separating_threshold() -> None:
    scores, labels = _separable()
    r = calibrate(scores, labels, n_boot=200, seed=1)
    assert 0.70 <= r.accept <= 0.76
    assert r.accept == pytest.approx(scores[labels == 1].min())
    assert r.auc == pytest.approx(1.0)
    assert r.skip <= r.accept
    assert (r.n, r.n_pos, r.n_neg) == (700, 300, 400)
    assert 0.70 <= r.ci["accept"].low <= r.ci["accept"].high <= 0.80
    assert r.ci["auc"].low > 0.99


def test_overlapping_classes_give_auc_below_one_and_ordered_thresholds() -> None:
    rng = np.random.default_rng(3)
    scores = np.r_[rng.normal(0.7, 0.08, 400), rng.normal(0.5, 0.08, 600)].clip(-1, 1)
    labels = np.r_[np.ones(400, int), np.zeros(600, int)]
    r = calibrate(scores, labels, n_boot=100)
    assert 0.85 < r.auc < 0.98
    # The Youden point of two equal-variance normals is half-way between the means.
    assert 0.56 < r.accept < 0.64
    assert r.skip < r.accept  # overlapping classes: a real low-confidence band
    assert r.ci["auc"].low < r.auc < r.ci["auc"].high
    assert r.adjustments == ()


# Hand-made: 6 hits, sorted by score.  labels: 1 1 0 1 0 0
TINY_S = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
TINY_Y = [1, 1, 0, 1, 0, 0]


def test_youden_on_a_tiny_case() -> None:
    # J at t=0.8: tpr 2/3, fpr 0 -> 0.667; at t=0.6: tpr 1, fpr 1/3 -> 0.667. Tie -> highest.
    r = calibrate(TINY_S, TINY_Y, n_boot=0)
    assert r.accept == 0.8
    assert r.auc == pytest.approx(8 / 9)


def test_precision_criterion_picks_lowest_threshold_reaching_target() -> None:
    # precision at >=0.9:1, >=0.8:1, >=0.7:2/3, >=0.6:3/4, >=0.5:3/5, >=0.4:1/2
    r = calibrate(TINY_S, TINY_Y, accept_criterion="precision", target_precision=0.75, n_boot=0)
    assert r.accept == 0.6
    r = calibrate(TINY_S, TINY_Y, accept_criterion="precision", target_precision=0.9, n_boot=0)
    assert r.accept == 0.8


def test_recall_skip_criterion_keeps_target_share_of_relevant_hits() -> None:
    # relevant scores 0.9, 0.8, 0.6: recall 2/3 needs t <= 0.8; recall 1.0 needs t <= 0.6
    r = calibrate(TINY_S, TINY_Y, target_recall=0.6, n_boot=0)
    assert r.skip == 0.8
    r = calibrate(
        TINY_S, TINY_Y, accept_criterion="precision", target_precision=0.75,
        target_recall=1.0, n_boot=0,
    )  # fmt: skip
    assert (r.accept, r.skip) == (0.6, 0.6)
    assert r.precision_recall_at(r.skip)[1] == 1.0


def test_skip_above_accept_is_lowered_to_accept_and_recorded() -> None:
    # accept by precision 0.75 -> 0.6; skip at recall 0.6 -> 0.8 > 0.6: clipped.
    r = calibrate(
        TINY_S, TINY_Y, accept_criterion="precision", target_precision=0.75,
        target_recall=0.6, n_boot=0,
    )  # fmt: skip
    assert r.accept == 0.6 and r.skip == 0.6
    assert len(r.adjustments) == 1 and "lowered to accept" in r.adjustments[0]


def test_unreachable_precision_and_unknown_criteria_raise() -> None:
    with pytest.raises(CalibrationError, match=r"precision 0\.99"):
        calibrate([0.9, 0.8, 0.7], [0, 1, 1], accept_criterion="precision",
                  target_precision=0.99, n_boot=0)  # fmt: skip
    with pytest.raises(CalibrationError, match="unknown accept criterion 'f1'"):
        calibrate(TINY_S, TINY_Y, accept_criterion="f1")
    with pytest.raises(CalibrationError, match="unknown skip criterion"):
        calibrate(TINY_S, TINY_Y, skip_criterion="npv")
    with pytest.raises(CalibrationError, match="both relevant and irrelevant"):
        calibrate([0.1, 0.2], [1, 1])


def test_inputs_are_not_mutated_and_bootstrap_is_seeded() -> None:
    scores, labels = _separable(11)
    before = scores.copy()
    a = calibrate(scores, labels, n_boot=50, seed=5)
    b = calibrate(scores, labels, n_boot=50, seed=5)
    assert np.array_equal(scores, before)
    assert a.ci == b.ci
    with pytest.raises(ValueError):
        a.scores[0] = 2.0  # result arrays are read-only


def test_compare_with_current_counts_label_changes_per_class() -> None:
    r = calibrate(TINY_S, TINY_Y, n_boot=0)  # accept 0.8, skip 0.6 (recall 0.95 -> all 3)
    assert (r.accept, r.skip) == (0.8, 0.6)
    ch = compare_with_current(r, None, current_accept=0.65, current_skip=0.62)
    # 0.7 (irrelevant): confident -> low_confidence; 0.6 (relevant): below_skip -> low.
    assert ch.transitions == {"below_skip->low_confidence": 1, "confident->low_confidence": 1}
    assert ch.changed_share == pytest.approx(2 / 6)
    assert ch.changed_share_relevant == pytest.approx(1 / 3)
    assert ch.changed_share_irrelevant == pytest.approx(1 / 3)
    assert label_score(0.8, 0.8, 0.6) == "confident"


def test_calibration_labels_hits_with_the_routers_rule() -> None:
    """compare_with_current counts label changes with the rule the router applies per hit."""
    policy = ConfidencePolicy(accept=0.7, skip=0.5, rule="per_hit")
    for s in (-1.0, 0.0, 0.4999, 0.5, 0.6, 0.6999, 0.7, 0.95, 1.0, float("nan")):
        assert label_score(s, 0.7, 0.5) == policy.label(s)
    assert [label_score(s, 0.7, 0.5) for s in (0.7, 0.5, 0.49, float("nan"))] == [
        "confident",
        "low_confidence",
        "below_skip",
        "below_skip",
    ]


def test_thresholds_json_round_trips_into_confidence_policy(settings) -> None:
    from context_core.routing import confidence

    scores, labels = _separable()
    r = calibrate(scores, labels, n_boot=20)
    path = write_thresholds(
        r,
        settings.resolved_thresholds_path,
        Provenance(model="minilm", collection="knowledge_main", labels_sha256="ab" * 32,
                   labels_path="labels.csv"),
    )  # fmt: skip
    doc = json.loads(path.read_text())
    assert doc["accept"] == r.accept and doc["skip"] == r.skip
    assert doc["provenance"]["model"] == "minilm" and doc["provenance"]["date"]
    assert doc["model"] == "minilm"  # top level: what the router checks against its encoder
    assert doc["criteria"]["accept"] == "youden" and doc["n"] == 700

    before = confidence.ConfidencePolicy.load(
        settings.model_copy(update={"reports_dir": path.parent / "none"})
    )
    policy = confidence.ConfidencePolicy.load(settings)
    assert (policy.accept, policy.skip) == (r.accept, r.skip)
    assert policy.source == str(path)
    # 0.74 was confident under the 0.72 default and is not under the calibrated ~0.75.
    assert before.label(0.74) == "confident"
    assert policy.label(0.74) != "confident"


def test_thresholds_record_the_model_as_collections_name_it(settings) -> None:
    """A hub id is written as the registry name the collection records, so the router's
    PolicySource accepts the file for that encoder and refuses it for another."""
    from context_core.routing.confidence import PolicySource

    scores, labels = _separable()
    r = calibrate(scores, labels, n_boot=0)
    prov = Provenance(model="sentence-transformers/all-MiniLM-L6-v2", collection="knowledge_main",
                      labels_sha256="ab" * 32, labels_path="labels.csv")  # fmt: skip
    path = write_thresholds(r, settings.resolved_thresholds_path, prov)
    doc = json.loads(path.read_text())
    assert doc["model"] == "minilm"
    assert doc["provenance"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert PolicySource(settings, model="minilm").current().pair == (r.accept, r.skip)
    refused = PolicySource(settings, model="bge-m3")
    assert refused.current().pair == (settings.accept_threshold, settings.skip_threshold)
    assert refused.status()["mismatch"] is True
