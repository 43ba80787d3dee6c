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
    assert not v.used and v.reasons == (
        "not_cited: output cites nothing checked by cites_source (citable: zzz-page)",
    )


def test_context_values_feed_the_default_rule() -> None:
    recs = [route("c1", l3=False, hits=(), query=""), output("c1", "window 14:00-14:30 applies")]
    (v,) = judge_steps(recs, accept=ACCEPT, rules=())
    assert not v.used and v.reasons[0].startswith("not_checkable: the step's context holds")
    (v,) = judge_steps(recs, accept=ACCEPT, rules=(),
                       context_values={"c1": {"alert": {"window": "14:00-14:30"}}})  # fmt: skip
    assert v.used and v.effective


def test_compute_cer_reads_trace_files_written_by_the_trace_writer(tmp_path: Path) -> None:
    from context_core import traces

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


# --- schema 2: required vs optional keys, citable tokens -------------------------------------


def route_v2(tid: str, *, requested: tuple[str, ...], required: tuple[str, ...],
             missing: tuple[str, ...] = (), expired: tuple[str, ...] = (),
             fragments: list[dict[str, Any]] | None = None, intent: str = "fetch_sensor_data",
             **kw: Any) -> dict[str, Any]:  # fmt: skip
    rec = route(tid, requested=requested, missing=missing, expired=expired, l3=False, hits=(),
                query="", intent=intent, **kw)  # fmt: skip
    rec["schema"] = 2
    rec["l2"]["required"] = list(required)
    rec["fragments"] = fragments or []
    return rec


def frag(layer: str, source: str, cites: list[str], confidence: float = 1.0) -> dict[str, Any]:
    label = "exact" if layer != "L3" else "confident"
    return {"layer": layer, "source": source, "confidence": confidence, "label": label,
            "cites": cites}  # fmt: skip


SERIES = "wm:{s1}:series:PUMP-0042.vibration"
CONTRACT = "wm:{s1}:contract:current"


def test_only_required_keys_decide_loading_optional_misses_are_notes() -> None:
    contract = frag("L2", f"L2:{CONTRACT}", [CONTRACT, "PUMP-0042"])
    recs = [
        # the series is optional here (not fetched yet): loaded, with an info note
        route_v2("o1", requested=(SERIES, CONTRACT), required=(), missing=(SERIES,),
                 fragments=[contract]),
        output("o1", "Fetching PUMP-0042 under the contract."),
        # the same miss when the intent requires the series: a loading failure
        route_v2("o2", requested=(SERIES, CONTRACT), required=(SERIES,), missing=(SERIES,),
                 fragments=[contract]),
        output("o2", "Fetching PUMP-0042 under the contract."),
        # an optional key that had been there and decayed: still only a note
        route_v2("o3", requested=(SERIES, CONTRACT), required=(), missing=(SERIES,),
                 expired=(SERIES,), fragments=[contract]),
        output("o3", "PUMP-0042"),
    ]  # fmt: skip
    v = {x.trace_id: x for x in judge_steps(recs, accept=ACCEPT)}
    assert v["o1"].effective and v["o1"].reasons == ()
    assert v["o1"].notes == (f"l2_optional_missing: {SERIES} (optional for this intent; not a "
                             "failure)",)  # fmt: skip
    assert not v["o2"].loaded and v["o2"].used
    assert v["o2"].reasons == (f"l2_missing: {SERIES} was never found",)
    assert v["o3"].effective and v["o3"].notes[0].startswith(f"l2_optional_expired: {SERIES}")
    rep = cer_report(list(v.values()))
    assert rep.overall.cer == pytest.approx(2 / 3)
    assert rep.failure_reasons == {"l2_missing": 1}
    assert rep.info_notes == {"l2_optional_missing": 1, "l2_optional_expired": 1}
    assert rep.to_dict()["info_notes"] == rep.info_notes


def test_schema_1_records_treat_every_requested_key_as_required() -> None:
    rec = route_v2("s1", requested=(SERIES, CONTRACT), required=(), missing=(SERIES,))
    del rec["l2"]["required"]
    rec["schema"] = 1
    rec["l3"]["query"] = "PUMP-0042 vibration"  # schema 1: no cites; device_id rule applies
    (v,) = judge_steps([rec, output("s1", "PUMP-0042")], accept=ACCEPT)
    assert not v.loaded and v.reasons == (f"l2_missing: {SERIES} was never found",)
    assert v.notes == ()


def test_fragment_cites_show_use_as_whole_tokens() -> None:
    series = frag("L2", f"L2:{SERIES}", [SERIES, "5.27", "2.3"])
    low = frag("L3", "L3:knowledge_main:p-low", ["p-low", "9999", "ISO 7919"], confidence=0.6)
    recs = [
        route_v2("u1", requested=(SERIES,), required=(SERIES,), fragments=[series, low],
                 intent="compare"),
        output("u1", "RMS is 5.27 mm/s now."),
        # 15.27 / 5.275 contain 5.27 but are other numbers: not a citation
        route_v2("u2", requested=(SERIES,), required=(SERIES,), fragments=[series, low],
                 intent="compare"),
        output("u2", "RMS went from 15.27 to 5.275 mm/s."),
        # citing only the below-accept L3 chunk is not evidence of using the trusted context
        route_v2("u3", requested=(SERIES,), required=(SERIES,), fragments=[series, low],
                 intent="compare"),
        output("u3", "The manual page p-low says 9999 hours."),
        # the key itself, as the bundle's context_used lists it, is a citation
        route_v2("u4", requested=(SERIES,), required=(SERIES,), fragments=[series],
                 intent="compare"),
        output("u4", f"sources: {SERIES}"),
    ]  # fmt: skip
    v = {x.trace_id: x for x in judge_steps(recs, accept=ACCEPT, rules=())}
    assert v["u1"].effective and v["u1"].rules_matched == ("cites_source",)
    assert not v["u2"].used
    assert v["u2"].reasons == (
        f"not_cited: output cites nothing checked by cites_source (citable: {SERIES}, 5.27, 2.3)",
    )
    assert not v["u3"].used and v["u3"].reasons[0].startswith("not_cited")
    assert v["u4"].effective


def test_a_step_with_nothing_citable_is_not_checkable_and_counts_as_failed() -> None:
    recs = [
        route_v2("n1", requested=(), required=(), fragments=[frag("L1", "L1:session.step", [])]),
        output("n1", "Done."),
        route_v2("n2", requested=(CONTRACT,), required=(),
                 fragments=[frag("L2", f"L2:{CONTRACT}", [CONTRACT])]),
        output("n2", "Done."),
    ]  # fmt: skip
    v = {x.trace_id: x for x in judge_steps(recs, accept=ACCEPT, rules=())}
    assert v["n1"].loaded and not v["n1"].used and not v["n1"].checkable
    assert v["n1"].reasons[0].startswith("not_checkable:")
    assert v["n2"].checkable and v["n2"].reasons[0].startswith("not_cited:")
    rep = cer_report(list(v.values()))
    # in the denominator: CER is over all steps (issue #5), uncheckable ones counted apart
    assert (rep.overall.n_steps, rep.overall.n_effective, rep.overall.n_not_checkable) == (2, 0, 1)
    assert rep.overall.to_dict()["n_not_checkable"] == 1
    assert rep.failure_reasons == {"not_checkable": 1, "not_cited": 1}


# --- schema 3: a lost contract, the thresholds the route used --------------------------------


def route_v3(tid: str, *, contract_lost: bool = False, accept: float = ACCEPT,
             **kw: Any) -> dict[str, Any]:  # fmt: skip
    rec = route_v2(tid, **kw)
    rec["schema"] = 3
    rec["l2"]["contract_lost"] = contract_lost
    conf = {"accept": accept, "skip": 0.5, "source": "test", "model": "minilm", "rule": "design"}
    rec.update(by_reference=[], fallback=None, confidence=conf)
    return rec


def test_a_lost_contract_is_a_loading_failure() -> None:
    from context_core.traces import validate_record

    series = frag("L2", f"L2:{SERIES}", [SERIES, "5.27"])
    recs = [
        # the contract was never written in this session: an optional miss, a note
        route_v3("c1", requested=(SERIES, CONTRACT), required=(), missing=(CONTRACT,),
                 fragments=[series]),
        output("c1", "RMS 5.27"),
        # the session had one and it expired: the step lost the user's goal
        route_v3("c2", requested=(SERIES, CONTRACT), required=(), missing=(CONTRACT,),
                 expired=(CONTRACT,), contract_lost=True, fragments=[series]),
        output("c2", "RMS 5.27"),
    ]  # fmt: skip
    for r in recs:
        if r["kind"] == "route":
            validate_record({**r, "trace_id": r["trace_id"] * 8})
    v = {x.trace_id: x for x in judge_steps(recs, accept=ACCEPT)}
    assert v["c1"].effective
    assert v["c1"].notes == (f"l2_optional_missing: {CONTRACT} (optional for this intent; not "
                             "a failure)",)  # fmt: skip
    assert not v["c2"].loaded and v["c2"].used
    assert v["c2"].reasons == (
        f"contract_lost: {CONTRACT} expired while the session was live (the user's goal and "
        "constraints are gone)",
    )
    assert v["c2"].notes == ()  # a failure, not also an info note
    rep = cer_report(list(v.values()))
    assert rep.failure_reasons == {"contract_lost": 1}
    assert rep.overall.cer == pytest.approx(1 / 2)


def test_schema_3_records_are_judged_against_their_own_accept() -> None:
    hit = [{"id": "h0", "score": 0.6, "label": "confident", "source": "Manual 7781",
            "section": "PUMP"}]  # fmt: skip
    recs = []
    for tid, accept in (("a1", 0.55), ("a2", 0.72)):
        rec = route_v3(tid, requested=(), required=(), accept=accept)
        rec["l3"] = {"requested": True, "query": "status", "used": True, "error": None,
                     "hits": hit}  # fmt: skip
        recs += [rec, output(tid, "see Manual 7781")]
    old = route("a3", requested=(), hits=((0.6, "Manual 7781"),), query="status")
    recs += [old, output("a3", "see Manual 7781")]
    v = {x.trace_id: x for x in judge_steps(recs, accept=0.72, rules=())}
    assert v["a1"].effective  # the route's own accept (0.55) was in force
    assert not v["a2"].loaded  # 0.6 < 0.72, recorded in the route itself
    assert v["a2"].reasons[0] == "l3_below_accept: best hit 0.600 < accept 0.720"
    assert not v["a3"].loaded  # schema 1: the accept passed in applies


def test_routes_labelled_by_the_relevance_model_are_judged_on_p_relevant() -> None:
    """A hit the relevance model made confident at a cosine below the cosine accept is loaded
    context, and one it rejected is not, whatever its cosine."""
    recs = []
    for tid, cosine, p in (("p1", 0.60, 0.40), ("p2", 0.80, 0.10)):
        label = "confident" if p >= 0.27 else "low_confidence"
        hit = [{"id": "h0", "score": cosine, "p_relevant": p, "label": label,
                "source": "Manual 7781", "section": "PUMP"}]  # fmt: skip
        rec = route_v3(tid, requested=(), required=(), accept=0.72)
        rec["l3"] = {"requested": True, "query": "status", "used": True, "error": None,
                     "hits": hit, "confidence_signal": "p_relevant"}  # fmt: skip
        rec["confidence"]["relevance"] = {"accept": 0.27, "skip": 0.15}
        recs += [rec, output(tid, "see Manual 7781")]
    v = {x.trace_id: x for x in judge_steps(recs, accept=0.72, rules=())}
    assert v["p1"].loaded and v["p1"].effective
    assert not v["p2"].loaded
    assert v["p2"].reasons[0] == "l3_below_accept: p_relevant 0.100 < accept 0.270"
