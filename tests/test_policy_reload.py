"""Thresholds bound to their model and reloaded without a restart (PolicySource).

Unit tests on a temp thresholds.json, then the router on real parts (Redis, Qdrant Edge, the
packaged MiniLM model; fixtures from test_router): a calibration written while the router
runs is in force on the next route, and every trace record names the thresholds it used.
"""

# ruff: noqa: F811  (pytest fixtures imported from test_router are parameters here)

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_router import Env, env  # noqa: F401 (fixtures)

from context_core.config import Settings, get_settings
from context_core.routing import confidence, file_watch
from context_core.routing.confidence import ConfidencePolicy, PolicySource, model_name
from evaluation.calibration import Provenance, calibrate, write_thresholds


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return get_settings(data_dir=tmp_path / "ctx", reports_dir=tmp_path / "reports", **kw)


def _write(path: Path, **doc: Any) -> None:
    """Atomic replace, as write_thresholds does (new inode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".tmp-thresholds.json")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    tmp.replace(path)


def test_no_file_means_settings_defaults(tmp_path: Path) -> None:
    src = PolicySource(_settings(tmp_path, accept_threshold=0.8, skip_threshold=0.6))
    policy = src.current()
    assert policy.pair == (0.8, 0.6) and policy.model is None and policy.rule == "design"
    st = src.status()
    assert (st["accept"], st["skip"], st["mismatch"], st["model"]) == (0.8, 0.6, False, None)
    assert "CTX_ACCEPT_THRESHOLD" in st["source"] and st["rule"] == "design"
    assert st["encoder_model"] == "minilm"  # settings.embed_model when no model is given
    assert st["loaded_at"] > 0


def test_file_changes_are_picked_up_on_the_next_call(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    path = settings.resolved_thresholds_path
    src = PolicySource(settings, model="minilm")
    assert src.current().pair == (0.72, 0.65)
    _write(path, accept=0.5, skip=0.3, model="minilm")
    first = src.current()
    assert (first.pair, first.source, first.model) == ((0.5, 0.3), str(path), "minilm")
    loaded_at = src.status()["loaded_at"]
    _write(path, accept=0.6, skip=0.3, model="minilm")
    assert src.current().pair == (0.6, 0.3)
    assert src.status()["loaded_at"] >= loaded_at
    # An in-place rewrite of the same size on the same inode: the mtime tells.
    ino = os.stat(path).st_ino
    path.write_text(json.dumps({"accept": 0.7, "skip": 0.3, "model": "minilm"}))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))
    assert os.stat(path).st_ino == ino
    assert src.current().pair == (0.7, 0.3)
    path.unlink()
    assert src.current().pair == (0.72, 0.65)  # removed: back to the defaults


def test_one_stat_per_call_and_no_read_while_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    _write(settings.resolved_thresholds_path, accept=0.5, skip=0.3, model="minilm")
    src = PolicySource(settings, model="minilm")
    stats: list[str] = []
    reads: list[Path] = []
    real_stat, real_read = os.stat, confidence._read_document

    def counting_stat(p: Any, *a: Any, **kw: Any) -> os.stat_result:
        stats.append(str(p))
        return real_stat(p, *a, **kw)

    def counting_read(p: Path) -> Any:
        reads.append(p)
        return real_read(p)

    monkeypatch.setattr(file_watch.os, "stat", counting_stat)
    monkeypatch.setattr(confidence, "_read_document", counting_read)
    for _ in range(50):
        assert src.current().pair == (0.5, 0.3)
    monkeypatch.undo()
    assert stats == [str(settings.resolved_thresholds_path)] * 50
    assert len(reads) == 1  # the first call loaded it; the other 49 only stat


def test_concurrent_readers_see_whole_policies(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    path = settings.resolved_thresholds_path
    _write(path, accept=0.5, skip=0.3, model="minilm")
    src = PolicySource(settings, model="minilm")
    seen: set[tuple[float, float]] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(src.current().pair)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(40):
            pair = (0.6, 0.4) if i % 2 else (0.5, 0.3)
            _write(path, accept=pair[0], skip=pair[1], model="minilm")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert seen <= {(0.5, 0.3), (0.6, 0.4)}  # whole loads only, never a mix or a gap
    assert src.current().pair == (0.6, 0.4)


def test_file_for_another_model_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    path = settings.resolved_thresholds_path
    _write(path, accept=0.49, skip=0.28, provenance={"model": "bge-m3"})
    src = PolicySource(settings, model="minilm")
    with caplog.at_level(logging.ERROR, logger="context_core.routing.confidence"):
        policy = src.current()
    assert policy.pair == (0.72, 0.65)  # the settings' defaults, not bge-m3's pair
    assert policy.model is None and "refused" in policy.source and "bge-m3" in policy.source
    (err,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "'bge-m3'" in err and "'minilm'" in err and str(path) in err
    assert "ctx eval calibrate" in err
    st = src.status()
    assert st["mismatch"] is True and st["file_model"] == "bge-m3"
    assert (st["accept"], st["skip"]) == (0.72, 0.65)
    caplog.clear()
    src.current()  # unchanged file: no second error
    assert not caplog.records
    _write(path, accept=0.5, skip=0.4, model="minilm")  # recalibrated for this model
    assert src.current().pair == (0.5, 0.4) and src.status()["mismatch"] is False


def test_mismatch_warn_uses_the_file_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path, thresholds_model_mismatch="warn")
    _write(settings.resolved_thresholds_path, accept=0.49, skip=0.28, model="bge-m3")
    src = PolicySource(settings, model="minilm")
    with caplog.at_level(logging.WARNING, logger="context_core.routing.confidence"):
        policy = src.current()
    assert policy.pair == (0.49, 0.28) and policy.model == "bge-m3"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "ANOTHER MODEL" in warning and "'bge-m3'" in warning and "'minilm'" in warning
    assert src.status()["mismatch"] is True


def test_legacy_file_without_model_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    _write(settings.resolved_thresholds_path, accept=0.6, skip=0.5)
    with caplog.at_level(logging.WARNING, logger="context_core.routing.confidence"):
        policy = PolicySource(settings, model="minilm").current()
    assert policy.pair == (0.6, 0.5) and policy.model is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "names no embedding model" in warning


def test_malformed_file_falls_back_and_recovers(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    path = settings.resolved_thresholds_path
    path.parent.mkdir(parents=True)
    path.write_text("{half a json", encoding="utf-8")
    src = PolicySource(settings, model="minilm")
    assert src.current().pair == (0.72, 0.65)
    _write(path, accept=0.55, skip=0.5, model="minilm")
    assert src.current().pair == (0.55, 0.5)


def test_model_names_compare_the_way_collections_record_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert model_name("minilm") == "minilm"
    assert model_name("sentence-transformers/all-MiniLM-L6-v2") == "minilm"
    assert model_name("BAAI/bge-m3") == "bge-m3"
    assert model_name("e5-small-other") == "e5-small-other"
    local = tmp_path / "models" / "my-model"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    # Encoder.name of a local model is its resolved path; a relative path matches it.
    assert model_name("models/my-model") == str(local.resolve())
    settings = _settings(tmp_path)
    _write(settings.resolved_thresholds_path, accept=0.6, skip=0.5, model="./models/my-model")
    src = PolicySource(settings, model=str(local.resolve()))
    assert src.current().pair == (0.6, 0.5) and src.status()["mismatch"] is False
    hub = PolicySource(settings.model_copy(update={"embed_model": "minilm"}))
    _write(
        settings.resolved_thresholds_path,
        accept=0.6,
        skip=0.4,
        model="sentence-transformers/all-MiniLM-L6-v2",
    )
    assert hub.current().pair == (0.6, 0.4) and hub.status()["mismatch"] is False


# --- the router over a PolicySource -------------------------------------------------------------


def test_calibration_written_while_the_router_runs_applies_on_the_next_route(env: Env) -> None:
    settings = env.settings
    query = "how much vibration is too much for a pump"
    top = env.knowledge.search(query, section="PUMP", limit=3)[0].score
    assert top < 0.72  # confident under neither the default nor the file below
    src = PolicySource(settings, model=env.knowledge.encoder.name)
    with env.router(policy=src) as router:
        assert router.policy.pair == (0.72, 0.65)
        before = router.route(env.state(), "default", params={"query": query})
        # A calibration lands while the router runs: scores above top - 0.05 are relevant.
        rng = np.random.default_rng(0)
        scores = np.r_[rng.uniform(top - 0.049, 1.0, 40), rng.uniform(-0.2, top - 0.051, 40)]
        labels = np.r_[np.ones(40, int), np.zeros(40, int)]
        result = calibrate(scores, labels, n_boot=0)
        assert result.skip <= result.accept <= top
        write_thresholds(
            result,
            settings.resolved_thresholds_path,
            Provenance(
                model=env.knowledge.encoder.name,
                collection=settings.collection_main,
                labels_sha256="ab" * 32,
                labels_path="labels.csv",
            ),
        )
        after = router.route(env.state(), "default", params={"query": query})
        status = router.policy_status()
    assert "confident" not in {f.label for f in before.by_layer("L3")}
    assert after.by_layer("L3")[0].label == "confident"
    assert status["accept"] == result.accept and status["model"] == "minilm"
    assert status["source"] == str(settings.resolved_thresholds_path)
    first, second = env.traces()
    assert first["confidence"] == {
        "accept": 0.72,
        "skip": 0.65,
        "source": "settings (CTX_ACCEPT_THRESHOLD / CTX_SKIP_THRESHOLD)",
        "model": None,
        "rule": "design",
        "version": None,
    }
    assert second["confidence"] == {
        "accept": result.accept,
        "skip": result.skip,
        "source": str(settings.resolved_thresholds_path),
        "model": "minilm",
        "rule": "design",
        "version": None,
    }


def test_router_refuses_thresholds_of_another_model(env: Env) -> None:
    settings = env.settings
    _write(settings.resolved_thresholds_path, accept=-0.5, skip=-0.9, model="bge-m3")
    query = "quarterly sales figures"
    with env.router(policy=PolicySource(settings, model=env.knowledge.encoder.name)) as router:
        b = router.route(env.state(), "default", params={"query": query})
        assert router.policy_status()["mismatch"] is True
    # With bge-m3's (absurd) pair every hit would be confident; the defaults keep L3 out.
    assert b.by_layer("L3") == ()
    (rec,) = env.traces()
    assert rec["confidence"]["accept"] == 0.72 and rec["confidence"]["model"] is None
    assert "refused" in rec["confidence"]["source"]


def test_fixed_policy_status(env: Env) -> None:
    with env.router(policy=ConfidencePolicy(accept=0.6, skip=0.5, source="test")) as router:
        assert router.policy.pair == (0.6, 0.5)
        assert router.policy_status() == {
            "accept": 0.6,
            "skip": 0.5,
            "source": "test",
            "model": None,
            "rule": "design",
            "version": None,
            "mismatch": False,
            "loaded_at": None,
        }


def test_recheck_bound_skips_the_stat_and_sees_a_change_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``policy_recheck_s`` the file is stat-ed at most once per bound: a promote within
    the bound is not seen yet, the first call after it sees the new pair."""
    settings = _settings(tmp_path, policy_recheck_s=1.0)
    path = Path(settings.resolved_thresholds_path)
    _write(path, accept=0.5, skip=0.3, model="minilm")
    now = [100.0]
    src = PolicySource(settings, model="minilm", clock=lambda: now[0])
    stats: list[str] = []
    real_stat = os.stat

    def counting_stat(p: Any, *a: Any, **kw: Any) -> os.stat_result:
        stats.append(str(p))
        return real_stat(p, *a, **kw)

    monkeypatch.setattr(file_watch.os, "stat", counting_stat)
    assert src.current().pair == (0.5, 0.3)
    assert src.relevance_in_force() == (None, None)
    for _ in range(20):
        now[0] += 0.04  # 0.8 s in all: within the bound
        assert src.current().pair == (0.5, 0.3)
        src.relevance_in_force()
    assert stats == [str(path), str(src.relevance_path)]  # one look at each file
    _write(path, accept=0.6, skip=0.4, model="minilm")
    assert src.current().pair == (0.5, 0.3)  # 0.8 s since the last look: not yet
    now[0] += 0.25
    assert src.current().pair == (0.6, 0.4)  # past the bound: the promote is in force
    assert stats.count(str(path)) == 2


def test_shadow_marker_recheck_bound(tmp_path: Path) -> None:
    from context_core.routing.shadow import ShadowSource

    now = [0.0]
    src = ShadowSource(tmp_path / "thresholds.json", recheck_s=1.0, clock=lambda: now[0])
    assert src.take() is None
    src.path.parent.mkdir(parents=True, exist_ok=True)
    src.path.write_text("{not json", encoding="utf-8")  # any change: a new key
    now[0] += 0.5
    assert src._key is None  # not looked at again within the bound
    src.take()
    assert src._key is None
    now[0] += 0.6
    src.take()
    assert src._key is not None  # looked again after the bound


def test_file_watch_looks_once_per_bound_and_sees_a_replacement(tmp_path: Path) -> None:
    now = [10.0]
    path = tmp_path / "thresholds.json"
    watch = file_watch.FileWatch(path, 1.0, clock=lambda: now[0])
    assert watch.look() is None  # no file yet
    path.write_text("{}", encoding="utf-8")
    now[0] += 0.9
    assert watch.look() == file_watch.NOT_DUE  # within the bound: not looked at
    now[0] += 0.1
    first = watch.look()
    assert first == file_watch.file_key(path) and first is not None
    tmp = tmp_path / "new.json"
    tmp.write_text("{}", encoding="utf-8")  # same size, maybe the same mtime tick
    tmp.replace(path)  # how the calibration tools write: a rename over it
    now[0] += 1.0
    assert watch.look() not in (first, file_watch.NOT_DUE)  # a new inode
    assert file_watch.FileWatch(path, 0.0).look() == file_watch.file_key(path)  # 0: every call


def test_reloading_loads_once_per_change_of_the_file(tmp_path: Path) -> None:
    """The policy files' shared reload: the loader runs on the first look and on each change
    of the file's key, never while it is unchanged or between looks."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class State:
        key: object
        text: str

    path = tmp_path / "relevance_model.json"
    loads: list[object] = []

    def load(key: file_watch.FileKey | None) -> State:
        loads.append(key)
        return State(key, path.read_text(encoding="utf-8") if key is not None else "")

    now = [0.0]
    watch = file_watch.FileWatch(path, 1.0, clock=lambda: now[0])
    r = file_watch.Reloading(watch, load, State("unread", "initial"), threading.Lock())
    assert r.current() == State(None, "") and loads == [None]  # no file: loaded as none
    path.write_text("one", encoding="utf-8")
    assert r.current().text == "" and len(loads) == 1  # within the bound: not looked at
    now[0] += 1.0
    assert r.current().text == "one" and len(loads) == 2
    now[0] += 1.0
    assert r.current().text == "one" and len(loads) == 2  # unchanged: not loaded again
    tmp = tmp_path / "new.json"
    tmp.write_text("two", encoding="utf-8")
    tmp.replace(path)
    now[0] += 1.0
    assert r.current().text == "two" and len(loads) == 3 and r.state.text == "two"
