"""Confidence policy: threshold edges, thresholds.json round trip, malformed files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from context_core.config import get_settings
from context_core.routing.confidence import ConfidencePolicy


def _settings(tmp_path: Path):
    return get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports")


def test_defaults_when_no_file(tmp_path: Path) -> None:
    policy = ConfidencePolicy.load(_settings(tmp_path))
    assert policy.pair == (0.72, 0.65)
    assert "CTX_ACCEPT_THRESHOLD" in policy.source


@pytest.mark.parametrize(
    ("score", "label"),
    [
        (1.0, "confident"),
        (0.72, "confident"),
        (0.7199999, "low_confidence"),
        (0.65, "low_confidence"),
        (0.6499999, "below_skip"),
        (-1.0, "below_skip"),
        (float("nan"), "below_skip"),
    ],
)
def test_label_edges(score: float, label: str) -> None:
    assert ConfidencePolicy().label(score) == label


@pytest.mark.parametrize("score", [1.7, 12.0, -1.5])
def test_distance_like_scores_are_refused(score: float) -> None:
    # A euclidean distance or 1-cos value beyond [-1, 1] means the caller mixed conventions.
    with pytest.raises(ValueError, match="cosine similarity"):
        ConfidencePolicy().label(score)


def test_thresholds_file_round_trip_changes_labels(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    default = ConfidencePolicy.load(settings)
    assert default.label(0.70) == "low_confidence"
    assert default.label(0.60) == "below_skip"

    path = settings.resolved_thresholds_path
    path.parent.mkdir(parents=True)
    doc = {"accept": 0.68, "skip": 0.55, "method": "roc-youden", "n_labels": 120}
    path.write_text(json.dumps(doc), encoding="utf-8")

    calibrated = ConfidencePolicy.load(settings)
    assert calibrated.pair == (0.68, 0.55)
    assert calibrated.source == str(path)
    assert calibrated.label(0.70) == "confident"
    assert calibrated.label(0.60) == "low_confidence"
    assert calibrated.label(0.50) == "below_skip"


def test_explicit_thresholds_path_setting(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps({"accept": 0.9, "skip": 0.1}), encoding="utf-8")
    settings = get_settings(data_dir=tmp_path / "ctx", thresholds_path=path)
    assert ConfidencePolicy.load(settings).pair == (0.9, 0.1)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "cannot be read as JSON"),
        ("[0.7, 0.6]", "expected a JSON object"),
        ('{"accept": 0.7}', "missing key(s) 'skip'"),
        ('{"accept": "0.7", "skip": 0.6}', '"accept" must be a finite number'),
        ('{"accept": true, "skip": 0.6}', '"accept" must be a finite number'),
        ('{"accept": NaN, "skip": 0.6}', '"accept" must be a finite number'),
        ('{"accept": 1.4, "skip": 0.6}', "outside [-1, 1]"),
        ('{"accept": 0.6, "skip": 0.7}', 'must not exceed "accept"'),
    ],
)
def test_malformed_file_falls_back_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, problem: str
) -> None:
    settings = _settings(tmp_path)
    path = settings.resolved_thresholds_path
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="context_core.routing.confidence"):
        policy = ConfidencePolicy.load(settings)
    assert policy.pair == (0.72, 0.65)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(path) in warnings[0]
    assert problem in warnings[0]


def test_policy_constructor_validates() -> None:
    with pytest.raises(ValueError, match="must not exceed"):
        ConfidencePolicy(accept=0.5, skip=0.6)


# --- labelling a route's hit list: the design rule vs per hit ------------------------------

POLICY = ConfidencePolicy(accept=0.72, skip=0.65, source="test")


@pytest.mark.parametrize(
    ("scores", "design", "per_hit"),
    [
        # one hit at/above skip: everything else is "for reference", even below skip
        (
            [0.80, 0.66, 0.40],
            ["confident", "low_confidence", "low_confidence"],
            ["confident", "low_confidence", "below_skip"],
        ),
        (
            [0.70, 0.30],
            ["low_confidence", "low_confidence"],
            ["low_confidence", "below_skip"],
        ),
        # exactly skip counts as at/above skip
        ([0.65, 0.10], ["low_confidence", "low_confidence"], ["low_confidence", "below_skip"]),
        # every hit below skip: L3 is left out under both rules
        ([0.6499, 0.2], ["below_skip", "below_skip"], ["below_skip", "below_skip"]),
        # NaN is never trusted and never counts as a hit at or above skip
        ([float("nan"), 0.5], ["below_skip", "below_skip"], ["below_skip", "below_skip"]),
        (
            [0.9, float("nan")],
            ["confident", "below_skip"],
            ["confident", "below_skip"],
        ),
        ([], [], []),
    ],
)
def test_label_hits_design_rule_and_per_hit_option(
    scores: list[float], design: list[str], per_hit: list[str]
) -> None:
    assert POLICY.rule == "design"  # the default
    assert POLICY.label_hits(scores) == design
    assert POLICY.with_rule("per_hit").label_hits(scores) == per_hit


def test_label_hits_range_checks_every_score() -> None:
    with pytest.raises(ValueError, match="cosine similarity"):
        POLICY.label_hits([0.9, 3.5])


def test_rule_comes_from_settings_and_is_validated(tmp_path: Path) -> None:
    settings = _settings(tmp_path).model_copy(update={"confidence_rule": "per_hit"})
    assert ConfidencePolicy.defaults(settings).rule == "per_hit"
    path = settings.resolved_thresholds_path
    assert tmp_path in path.parents  # never the repository's reports/
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"accept": 0.7, "skip": 0.5, "model": "minilm"}))
    loaded = ConfidencePolicy.load(settings)
    assert (loaded.rule, loaded.model) == ("per_hit", "minilm")
    assert loaded.to_dict() == {
        "accept": 0.7, "skip": 0.5, "source": str(path), "model": "minilm", "rule": "per_hit",
        "version": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match="unknown confidence rule"):
        ConfidencePolicy(rule="loose")  # type: ignore[arg-type]


def test_model_from_provenance_when_no_top_level_model(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    path = settings.resolved_thresholds_path
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"accept": 0.7, "skip": 0.5, "provenance": {"model": "bge-m3"}}))
    assert ConfidencePolicy.load(settings).model == "bge-m3"
    path.write_text(json.dumps({"accept": 0.7, "skip": 0.5, "model": 3}))
    assert ConfidencePolicy.load(settings).pair == (0.72, 0.65)  # malformed: defaults
