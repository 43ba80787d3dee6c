"""Context health snapshot on real Redis and a real Qdrant Edge store."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import numpy as np
import redis
from conftest import cleanup_keys

from evaluation.health import (
    expiry_rate,
    key_pattern,
    load_history,
    lowest_confidence_queries,
    probe_l1,
    run_health_report,
    sample_l2,
)


def test_key_pattern_replaces_ids() -> None:
    assert key_pattern("wm:{sess-42}:api:" + "9f" * 32) == "wm:{*}:api:*"
    assert key_pattern("wm:{abc}:step:diagnose") == "wm:{*}:step:diagnose"
    assert key_pattern("pref:{u-7}:units") == "pref:{*}:units"
    assert key_pattern("embcache:minilm:" + "0a" * 32) == "embcache:minilm:*"
    assert key_pattern("ns:{plant}:alerts:PUMP-0042") == "ns:{*}:alerts:*"


def test_l1_probe_measures_and_finds_no_violation() -> None:
    p = probe_l1(30)
    assert p.n_instances == 30 and p.trace_pairs == 10
    assert p.violations == 0 and p.violation_details == ()
    assert p.mutation_attempts >= 2 * 8
    # the trace's 20 items dominate: far more than the slotted object itself
    assert p.bytes_per_instance > 10 * p.getsizeof_bytes > 0


def test_sample_l2_counts_by_scan_and_sees_expiries(redis_url: str, session_id: str) -> None:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for i in range(25):
            c.set(f"wm:{{{session_id}}}:api:{i:02d}" + "ab" * 30, "x", ex=60)
        c.set(f"wm:{{{session_id}}}:step:diagnose", "x", ex=60)
        # the sample covers the whole shared test DB: other tests' key families must not push
        # this one out of the reported patterns
        before = sample_l2(c, match=f"wm:{{{session_id}}}:*", sample_size=1_000_000, top=100_000)
        assert before.wm_keys == 26 and before.wm_keys_exact
        hot = {p: n for p, n, _ in before.hot_patterns}
        assert hot["wm:{*}:api:*"] >= 25
        capped = sample_l2(c, match=f"wm:{{{session_id}}}:*", scan_budget=10)
        assert capped.wm_keys == 10 and not capped.wm_keys_exact
        c.set(f"wm:{{{session_id}}}:step:short", "x", px=20)
        time.sleep(0.1)
        assert c.get(f"wm:{{{session_id}}}:step:short") is None  # lazily expired on access
        after = sample_l2(c, match=f"wm:{{{session_id}}}:*")
        assert after.expired_keys_total >= before.expired_keys_total + 1
        assert after.run_id == before.run_id
    finally:
        c.close()
        cleanup_keys(redis_url, f"wm:{{{session_id}}}:*")


def test_expiry_rate_between_runs() -> None:
    from evaluation.health import L2Stats

    cur = L2Stats(10, 5, True, 130, "r1", 10, ())
    prev = {"day": "2026-11-27", "taken_at": "2026-11-27T06:00:00+00:00",
            "l2": {"expired_keys_total": 100, "run_id": "r1"}}  # fmt: skip
    assert expiry_rate(cur, "2026-11-28T06:00:00+00:00", prev) == (30, 30 / 24)
    restarted = dict(prev, l2={"expired_keys_total": 100, "run_id": "r0"})
    assert expiry_rate(cur, "2026-11-28T06:00:00+00:00", restarted) == (None, None)
    assert expiry_rate(cur, "2026-11-28T06:00:00+00:00", None) == (None, None)


def test_lowest_confidence_queries() -> None:
    def rec(q: str, scores: list[float], requested: bool = True) -> dict:
        return {"kind": "route", "trace_id": q, "ts": "2026-11-28T10:00:00+00:00",
                "intent": "diagnose",
                "l3": {"requested": requested, "query": q,
                       "hits": [{"score": s} for s in scores]}}  # fmt: skip

    recs = [rec("a", [0.9, 0.5]), rec("b", [0.4]), rec("c", []), rec("d", [0.1], False),
            rec("e", [0.6, 0.7]), rec("f", [0.95]), rec("g", [0.3])]  # fmt: skip
    low = lowest_confidence_queries(recs, n=5)
    assert [q.query for q in low] == ["c", "g", "b", "e", "a"]
    assert low[0].best_score is None and low[1].best_score == 0.3


def _route(tid: str, ts: str, score: float) -> dict:
    return {
        "trace_id": tid, "ts": ts, "session_id": "s-h", "step": 1, "intent": "diagnose",
        "agent_id": None,
        "l2": {"requested": [], "found": [], "missing": [], "expired": []},
        "l3": {"requested": True, "query": f"PUMP-0042 query {tid}", "used": True, "error": None,
               "hits": [{"id": "h", "score": score, "label": "confident", "source": "SOP-1",
                         "section": "PUMP"}]},
        "ns": {"requested": [], "found": [], "denied": []}, "fragments": [], "degraded": False,
        "timings_ms": {"l1": 0.1, "l2": 0.1, "l3": 1.0, "total": 1.2},
    }  # fmt: skip


def test_health_report_is_idempotent_per_day_and_tracks_growth(
    settings, redis_url: str, session_id: str
) -> None:
    from context_core.ingest.pipeline import QUARANTINE_FILE
    from context_core.knowledge.edge import EdgeStore
    from context_core.knowledge.store import PointRecord, point_id
    from context_core.traces import TraceWriter

    rng = np.random.default_rng(0)

    def points(start: int, n: int) -> list[PointRecord]:
        out = []
        for i in range(start, start + n):
            v = rng.normal(size=8)
            out.append(PointRecord(point_id("doc", i), (v / np.linalg.norm(v)).tolist(),
                                   {"source": "doc", "section": "PUMP", "text": "t"}))  # fmt: skip
        return out

    # Two days ending today: outputs are stamped "now", after their routes (next-day slack).
    day2 = dt.datetime.now(dt.UTC).date()
    day1 = day2 - dt.timedelta(days=1)
    w = TraceWriter(settings.traces_dir)
    w.write_route(_route("t1", f"{day1}T09:00:00+00:00", 0.9))
    w.record_output("t1", "s-h", 1, "PUMP-0042 handled per SOP-1")
    w.write_route(_route("t2", f"{day2}T00:00:00+00:00", 0.3))
    w.close()
    Path(settings.reports_dir).mkdir(parents=True, exist_ok=True)
    (Path(settings.reports_dir) / QUARANTINE_FILE).write_text(
        "".join(
            json.dumps({"run_id": rid, "at": f"{day}T02:00:00+00:00", "kind": kind,
                        "source_path": f"x/{n}.html", "reason": reason}) + "\n"
            for rid, day, kind, n, reason in [
                ("r1", day1, "quarantined", 1, "empty body: #main-content has no text"),
                ("r2", day2, "quarantined", 1, "empty body: #main-content has no text"),
                ("r2", day2, "quarantined", 2, "page is 9000000 bytes, over max_page_bytes"),
                ("r2", day2, "warning", 3, "no parseable last-modified date"),
            ]
        )
        + "not json\n"
    )  # fmt: skip
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    store = EdgeStore(settings.qdrant_dir)
    try:
        c.set(f"wm:{{{session_id}}}:step:x", "1", ex=60)
        store.create_collection(settings.collection_main, dim=8, model="probe")
        store.upsert(settings.collection_main, points(0, 3))
        run_health_report(settings, day=day1, redis_client=c, store=store)
        run_health_report(settings, day=day1, redis_client=c, store=store)  # same day again
        hist_path = Path(settings.data_dir) / "health" / "history.jsonl"
        assert [r["day"] for r in load_history(hist_path)] == [day1.isoformat()]

        store.upsert(settings.collection_main, points(3, 2))
        paths = run_health_report(settings, day=day2, redis_client=c, store=store)
    finally:
        store.close()
        c.close()
        cleanup_keys(redis_url, f"wm:{{{session_id}}}:*")
    history = load_history(hist_path)
    assert [r["day"] for r in history] == [day1.isoformat(), day2.isoformat()]
    assert [r["l3"]["knowledge_main"] for r in history] == [3, 5]
    assert all(r["l1"]["violations"] == 0 for r in history)
    md = paths["markdown"].read_text()
    assert f"| L3 | `knowledge_main` points (probe) | 5 | +2 since {day1} |" in md
    assert "| L1 | immutability violations" in md and "| 0 | ✅ |" in md
    assert "PUMP-0042 query t2" in md  # lowest-confidence query of the day
    y, wk, _ = day2.isocalendar()
    assert "CER" in md and f"{y}-W{wk:02d}" in md
    doc = json.loads(paths["json"].read_text())
    assert doc["cer"]["overall"]["n_steps"] == 2 and doc["cer"]["overall"]["n_effective"] == 1
    assert doc["ingest"]["quarantined"] == 3 and doc["ingest"]["warnings"] == 1
    assert (doc["ingest"]["last_run_id"], doc["ingest"]["last_run_quarantined"]) == ("r2", 2)
    assert "| ingest | quarantined pages in the period / last run | 3 / 2 in run `r2` |" in md
    assert "| empty body | 2 |" in md
    for key in ("l1_memory", "l2_keys", "l3_points", "cer"):
        assert paths[key].stat().st_size > 1000


def test_health_report_names_the_thresholds_and_a_model_mismatch(settings, redis_url: str) -> None:
    from context_core.knowledge.edge import EdgeStore

    path = settings.resolved_thresholds_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"accept": 0.49, "skip": 0.28, "model": "bge-m3"}))
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    store = EdgeStore(settings.qdrant_dir)
    try:
        paths = run_health_report(settings, redis_client=c, store=store)
        md = paths["markdown"].read_text()
        # refused (the encoder is minilm): the settings' defaults are in force, and it says why
        assert "Thresholds in force: accept 0.720" in md
        assert "calibrated for model 'bge-m3', not 'minilm'" in md and "rule design" in md
        path.write_text(json.dumps({"accept": 0.5, "skip": 0.3, "model": "minilm"}))
        md = run_health_report(settings, redis_client=c, store=store)["markdown"].read_text()
        assert "Thresholds in force: accept 0.500" in md
        assert "(calibration version none, model minilm, rule design)" in md
        assert "calibrated for model" not in md
    finally:
        store.close()
        c.close()
