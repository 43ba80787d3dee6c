"""CER on hand-written traces (schema of context_core.traces) with known answers."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from evaluation.cer import UseRule, cer_report, compute_cer, judge_steps, load_rules

ACCEPT = 0.72


def route(tid: str, *, sid: str = "s1", intent: str = "diagnose", step: int = 1,
          ts: str = "2026-11-23T10:00:00+00:00", requested=("wm:{s1}:step:a",),
          missing=(), expired=(), l3: bool = True, hits=((0.8, "SOP-PUMP-12"),),
          error: str | None = None,
          query: str = "PUMP-0042 vibration") -> dict[str, Any]:  # fmt: skip
    found = [k for k in requested if k not in missing]
    return {
        "schema": 1, "kind": "route", "trace_id": tid, "ts": ts, "session_id": sid,
        "step": step, "intent": intent, "agent_id": None,
        "l2": {"requested": list(requested), "found": found, "missing": list(missing),
               "expired": list(expired)},
        "l3": {"requested": l3, "query": query, "used": bool(hits), "error": error,
               "hits": [{"id": f"h{i}", "score": s, "label": "confident", "source": src,
                         "section": "PUMP"} for i, (s, src) in enumerate(hits)]},
        "ns": {"requested": [], "found": [], "denied": []},
        "fragments": [], "degraded": error is not None,
        "timings_ms": {"l1": 0.1, "l2": 0.5, "l3": 3.0, "total": 4.0},
    }  # fmt: skip


def output(tid: str, text: str, sid: str = "s1") -> dict[str, Any]:
    return {"schema": 1, "kind": "step_output", "trace_id": tid, "session_id": sid,
            "ts": "2026-11-23T10:00:01+00:00", "step": 1, "output": text}  # fmt: skip


def records() -> list[dict[str, Any]]:
    return [
        # t1: all good; cites the device id from the query and the standard
        route("t1", query="PUMP-0042 vibration limits ISO 10816"),
        output("t1", "PUMP-0042 exceeds ISO 10816-3 zone C; stop the pump."),
        # t2: an L2 key expired before the step -> not loaded (used though)
        route("t2", requested=("wm:{s1}:step:a", "wm:{s1}:api:x"),
              missing=("wm:{s1}:api:x",), expired=("wm:{s1}:api:x",)),
        output("t2", "PUMP-0042 looks fine"),
        # t3: best L3 hit below accept -> not loaded
        route("t3", hits=((0.70, "SOP-PUMP-12"), (0.5, "x"))),
        output("t3", "PUMP-0042 per SOP-PUMP-12"),
        # t4: loaded, but the output cites nothing from the context
        route("t4", intent="report", sid="s2", ts="2026-11-30T09:00:00+00:00"),
        output("t4", "All good, nothing to report.", sid="s2"),
        # t5: loaded, used by citing the confident hit's source; next week
        route("t5", intent="report", sid="s2", ts="2026-11-30T09:05:00+00:00", query="status",
              hits=((0.8, "Manual 7781"),)),
        output("t5", "See manual   7781 for the procedure.", sid="s2"),
        # t6: no output recorded; L2 key never written (missing, not expired)
        route("t6", missing=("wm:{s1}:step:a",), ts="2026-11-30T09:10:00+00:00", l3=False),
    ]  # fmt: skip


def test_verdicts_and_reasons() -> None:
    v = {x.trace_id: x for x in judge_steps(records(), accept=ACCEPT)}
    assert (v["t1"].loaded, v["t1"].used, v["t1"].reasons) == (True, True, ())
    assert set(v["t1"].rules_matched) >= {"device_id", "standard"}
    assert not v["t2"].loaded and v["t2"].used
    assert v["t2"].reasons == ("l2_expired: wm:{s1}:api:x expired before the step loaded it",)
    assert not v["t3"].loaded
    assert v["t3"].reasons == ("l3_below_accept: best hit 0.700 < accept 0.720",)
    assert v["t4"].loaded and not v["t4"].used
    assert v["t4"].reasons[0].startswith("not_cited: output cites nothing checked by device_id")
    assert v["t5"].effective and v["t5"].rules_matched == ("cites_source",)
    assert v["t6"].reasons == (
        "l2_missing: wm:{s1}:step:a was never found",
        "no_output: no step_output record for this trace_id",
    )


def test_aggregates_overall_intent_session_day_week() -> None:
    rep = cer_report(judge_steps(records(), accept=ACCEPT))
    assert (rep.overall.n_steps, rep.overall.n_effective) == (6, 2)
    assert rep.overall.cer == pytest.approx(2 / 6)
    assert rep.by_intent["diagnose"].cer == pytest.approx(1 / 4)
    assert rep.by_intent["report"].cer == pytest.approx(1 / 2)
    assert rep.by_session["s2"].n_steps == 2
    assert set(rep.by_day) == {"2026-11-23", "2026-11-30"}
    assert list(rep.by_week) == ["2026-W48", "2026-W49"]
    w48, w49 = rep.week_over_week
    assert w48.cer == pytest.approx(1 / 3) and w48.change is None
    assert w49.cer == pytest.approx(1 / 3) and w49.change == pytest.approx(0.0)
    assert rep.failure_reasons == {"l2_expired": 1, "l3_below_accept": 1, "not_cited": 1,
                                   "l2_missing": 1, "no_output": 1}  # fmt: skip
    assert {f.trace_id for f in rep.failures} == {"t2", "t3", "t4", "t6"}
    assert rep.to_dict()["overall"]["cer"] == pytest.approx(0.333333)


def test_l3_error_and_intent_scoped_rules() -> None:
    recs = [route("e1", error="timeout after 100 ms"), output("e1", "PUMP-0042")]
    (v,) = judge_steps(recs, accept=ACCEPT)
    assert v.reasons == ("l3_error: timeout after 100 ms",)
    # a rule that only applies to "report" and needs no context value
    rule = UseRule("has_window", r"last \d+ minutes", intents=frozenset({"report"}),
                   require_in_context=False)  # fmt: skip
    recs = [route("r1", intent="report", query="q", hits=((0.9, "zzz-page"),)),
            output("r1", "in the last 15 minutes nothing happened")]  # fmt: skip
    (v,) = judge_steps(recs, accept=ACCEPT, rules=(rule,))
    assert v.used and v.rules_matched == ("has_window",)
    (v,) = judge_steps([dict(recs[0], intent="diagnose"), recs[1]], accept=ACCEPT, rules=(rule,))
    assert not v.used and v.reasons == ("not_cited: output cites nothing checked by cites_source",)


def test_context_values_feed_the_default_rule() -> None:
    recs = [route("c1", l3=False, hits=(), query=""), output("c1", "window 14:00-14:30 applies")]
    (v,) = judge_steps(recs, accept=ACCEPT, rules=())
    assert not v.used and v.reasons[0].startswith("not_checkable")
    (v,) = judge_steps(recs, accept=ACCEPT, rules=(),
                       context_values={"c1": {"alert": {"window": "14:00-14:30"}}})  # fmt: skip
    assert v.used and v.effective


def test_compute_cer_reads_trace_files_written_by_the_trace_writer(tmp_path: Path) -> None:
    traces = pytest.importorskip("context_core.traces")
    pytest.importorskip("context_core.gateway")
    w = traces.TraceWriter(tmp_path / "traces")
    for rec in records():
        if rec["kind"] == "route":
            w.write_route(rec)
        else:
            w.record_output(rec["trace_id"], rec["session_id"], rec["step"], rec["output"])
    w.close()
    rep = compute_cer(tmp_path / "traces", accept=ACCEPT)
    assert rep.overall.n_steps == 6 and rep.overall.n_effective == 2
    rep = compute_cer(tmp_path / "traces", accept=ACCEPT, since=dt.date(2026, 11, 30))
    assert rep.overall.n_steps == 3


def test_rules_file(tmp_path: Path) -> None:
    p = tmp_path / "rules.json"
    p.write_text('[{"name": "std", "pattern": "ISO \\\\d+", "intents": ["diagnose"]}]')
    (r,) = load_rules(p)
    assert r.name == "std" and r.intents == frozenset({"diagnose"}) and r.require_in_context
    p.write_text('[{"name": "bad", "pattern": "("}]')
    with pytest.raises(ValueError, match="rule 1: use rule 'bad': invalid regex"):
        load_rules(p)
