"""Trace writer: schema validation on write, daily files, thread safety, reading back."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from context_core.errors import DataValidationError
from context_core.gateway.sanitize import Gateway
from context_core.traces import (
    MAX_CITES,
    TraceWriter,
    citable_tokens,
    fragment_cites,
    new_trace_id,
    read_traces,
    trace_file,
    validate_record,
)

ROUTE_KEYS = {
    "schema",
    "kind",
    "trace_id",
    "ts",
    "session_id",
    "step",
    "intent",
    "agent_id",
    "l2",
    "l3",
    "ns",
    "fragments",
    "by_reference",
    "fallback",
    "confidence",
    "degraded",
    "timings_ms",
}
V3_ONLY = ("by_reference", "fallback", "confidence")


def route_record(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "trace_id": new_trace_id(),
        "session_id": "s-1",
        "step": 2,
        "intent": "generate_report",
        "agent_id": "agent-a",
        "l2": {
            "requested": ["wm:{s-1}:step:1", "wm:{s-1}:contract:current"],
            "required": ["wm:{s-1}:step:1"],
            "found": ["wm:{s-1}:step:1", "wm:{s-1}:contract:current"],
            "missing": [],
            "expired": [],
            "contract_lost": False,
        },
        "l3": {
            "requested": True,
            "query": "pump report",
            "hits": [
                {
                    "id": "00000000-0000-0000-0000-000000000001",
                    "score": 0.8,
                    "label": "confident",
                    "source": "page-1",
                    "section": "PUMP",
                }
            ],
            "used": True,
            "error": None,
        },
        "ns": {"requested": [], "found": [], "denied": []},
        "fragments": [
            {
                "layer": "L2",
                "source": "L2:wm:{s-1}:step:1",
                "confidence": 1.0,
                "label": "exact",
                "cites": ["wm:{s-1}:step:1", "PUMP-0042", "5.27"],
            }
        ],
        "by_reference": [
            {"layer": "L1", "source": "L1:session.user_query", "relevance": 1.0, "label": "exact"}
        ],
        "fallback": None,
        "confidence": {
            "accept": 0.72,
            "skip": 0.65,
            "source": "settings (CTX_ACCEPT_THRESHOLD / CTX_SKIP_THRESHOLD)",
            "model": None,
            "rule": "design",
        },
        "degraded": False,
        "timings_ms": {"l1": 0.01, "l2": 0.3, "l3": 4.2, "total": 4.6},
    }
    rec.update(over)
    return rec


def route_record_v2(**over: Any) -> dict[str, Any]:
    """The same decision in the schema-2 shape (no contract_lost, by_reference, ...)."""
    rec = {k: v for k, v in route_record().items() if k not in V3_ONLY}
    rec["l2"] = {k: v for k, v in rec["l2"].items() if k != "contract_lost"}
    rec.update(over)
    return rec


def test_route_record_written_with_exact_fields(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, gateway=Gateway())
    written = writer.write_route(route_record())
    files = list(tmp_path.glob("traces-*.jsonl"))
    assert [f.name for f in files] == [f"traces-{dt.datetime.now(dt.UTC).date()}.jsonl"]
    lines = files[0].read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert set(rec) == ROUTE_KEYS
    assert rec == written
    assert rec["schema"] == 3 and rec["kind"] == "route"
    assert set(rec["l2"]) == {
        "requested", "required", "found", "missing", "expired", "contract_lost",
    }  # fmt: skip
    assert rec["l2"]["contract_lost"] is False
    assert rec["by_reference"] == [
        {"layer": "L1", "source": "L1:session.user_query", "relevance": 1.0, "label": "exact"}
    ]
    assert rec["fallback"] is None
    assert set(rec["confidence"]) == {"accept", "skip", "source", "model", "rule"}
    assert set(rec["fragments"][0]) == {"layer", "source", "confidence", "label", "cites"}
    assert rec["fragments"][0]["cites"] == ["wm:{s-1}:step:1", "PUMP-0042", "5.27"]
    assert set(rec["l3"]) == {"requested", "query", "hits", "used", "error"}
    assert set(rec["l3"]["hits"][0]) == {"id", "score", "label", "source", "section"}
    assert set(rec["timings_ms"]) == {"l1", "l2", "l3", "total"}
    dt.datetime.fromisoformat(rec["ts"])  # ISO timestamp


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"step": "2"}, "step"),
        ({"degraded": "no"}, "degraded"),
        ({"extra": 1}, "extra"),
        ({"l2": {"requested": [], "required": [], "found": [], "missing": []}}, "l2.expired"),
        (
            {"schema": 2, "l2": {"requested": [], "found": [], "missing": [], "expired": []}},
            "l2.required",
        ),
        ({"schema": 4}, "schema"),
        ({"schema": 2}, "by_reference"),  # a schema-2 record may not carry schema-3 fields
        ({"schema": 1}, "cites"),  # a schema-1 record may not carry schema-2 fields
        ({"l2": {**route_record()["l2"], "contract_lost": "no"}}, "l2.contract_lost"),
        ({"confidence": {**route_record()["confidence"], "rule": "vibes"}}, "confidence.rule"),
        ({"confidence": {"accept": 0.7, "skip": 0.6}}, "confidence.source"),
        ({"by_reference": [{"layer": "L2", "source": "x", "relevance": 1.0}]}, "label"),
        ({"fallback": {"triggered": True}}, "fallback.reason"),
        ({"fragments": [{"layer": "L2", "source": "x", "confidence": 1.0, "label": "e"}]}, "cites"),
        ({"timings_ms": {"l1": 0, "l2": 0, "l3": 0}}, "timings_ms.total"),
        ({"fragments": [{"layer": "L9", "source": "x", "confidence": 1.0, "label": "e"}]}, "layer"),
        ({"ts": "yesterday"}, "ts"),
    ],
)
def test_invalid_record_is_refused_and_not_written(
    tmp_path: Path, over: dict[str, Any], field: str
) -> None:
    writer = TraceWriter(tmp_path, gateway=Gateway())
    with pytest.raises(DataValidationError, match=field.split(".")[0]) as exc:
        writer.write_route(route_record(**over))
    assert any(field.split(".")[-1] in f for f in exc.value.failures)
    assert not list(tmp_path.glob("*.jsonl"))


def test_query_and_output_are_gateway_cleaned(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, gateway=Gateway())
    secret = "sk_live_" + "a" * 24
    rec = route_record()
    rec["l3"] = {**rec["l3"], "query": f"why does key {secret} fail for 13812341234"}
    writer.write_route(rec)
    writer.record_output(rec["trace_id"], "s-1", 2, f"used {secret}")
    text = next(tmp_path.glob("*.jsonl")).read_text(encoding="utf-8")
    assert secret not in text
    assert "13812341234" not in text
    out = list(read_traces(tmp_path, kind="step_output"))
    assert len(out) == 1
    assert out[0]["trace_id"] == rec["trace_id"]
    assert out[0]["step"] == 2
    assert set(out[0]) == {"schema", "kind", "trace_id", "ts", "session_id", "step", "output"}
    assert out[0]["schema"] == 3
    validate_record(out[0])


def test_cites_pass_the_gateway_and_changed_tokens_are_dropped(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, gateway=Gateway())
    secret = "sk_live_" + "b" * 24
    rec = route_record()
    rec["fragments"] = [
        {**rec["fragments"][0], "cites": ["PUMP-0042", secret, "13812341234", "5.27"]}
    ]
    written = writer.write_route(rec)
    assert written["fragments"][0]["cites"] == ["PUMP-0042", "5.27"]
    text = next(tmp_path.glob("*.jsonl")).read_text(encoding="utf-8")
    assert secret not in text and "13812341234" not in text and "138****1234" not in text


def test_schema_2_records_stay_valid_and_are_stamped_as_such(tmp_path: Path) -> None:
    """A caller writing the schema-2 shape (no confidence block) gets schema 2, not 3."""
    rec = route_record_v2()
    validate_record({**rec, "schema": 2, "kind": "route", "ts": "2026-03-01T12:00:00+00:00"})
    writer = TraceWriter(tmp_path, gateway=Gateway())
    assert writer.write_route(rec)["schema"] == 2
    with pytest.raises(DataValidationError, match="schema 3") as exc:
        writer.write_route({**rec, "schema": 3})
    assert any(f.startswith("confidence") for f in exc.value.failures)
    assert any(f.startswith("l2.contract_lost") for f in exc.value.failures)
    (back,) = read_traces(tmp_path)
    assert back["schema"] == 2 and "contract_lost" not in back["l2"]


def test_schema_1_records_stay_valid_and_are_stamped_as_such(tmp_path: Path) -> None:
    """Old files keep validating; a caller writing the old l2 shape gets schema 1, not 2."""
    rec = route_record_v2()
    rec["l2"] = {k: v for k, v in rec["l2"].items() if k != "required"}
    rec["fragments"] = [{k: v for k, v in f.items() if k != "cites"} for f in rec["fragments"]]
    validate_record({**rec, "schema": 1, "kind": "route", "ts": "2026-03-01T12:00:00+00:00"})
    writer = TraceWriter(tmp_path, gateway=Gateway())
    assert writer.write_route(rec)["schema"] == 1
    with pytest.raises(DataValidationError, match="schema 2") as exc:
        writer.write_route({**rec, "schema": 2})
    assert any(f.startswith("l2.required") for f in exc.value.failures)
    (back,) = read_traces(tmp_path)
    assert back["schema"] == 1 and "required" not in back["l2"]


def test_citable_tokens_keep_ids_and_numbers_not_words_or_timestamps() -> None:
    value = {
        "points": 12,  # too common to be evidence
        "newest": [1_796_000_000.5, 5.271],  # epoch-sized timestamp left out, value rounded
        "fields": {"device": "PUMP-0042", "report_length": "short", "ok": True},
        "note": "alarm above 4.5 mm/s since 06:00, see ISO 10816-3; serviced 2026-08-14.",
        "bearing_hours": 17400.0,
        "tiny": [0.05, 0.5, 3.0, 7],
        "dup": "PUMP-0042",
    }
    assert citable_tokens(value) == [
        "5.27", "PUMP-0042", "4.5", "06:00", "10816-3", "2026-08-14", "17400",
    ]  # fmt: skip
    many = [f"DEV-{i:04d}" for i in range(40)]
    assert citable_tokens(many) == many[:MAX_CITES]
    assert citable_tokens(many, limit=3) == many[:3]
    assert citable_tokens("nothing here but words") == []
    assert citable_tokens(None) == [] and citable_tokens(float("nan")) == []


def test_fragment_cites_per_layer() -> None:
    assert fragment_cites("L2", "L2:wm:{s}:series:PUMP-7.vibration", {"newest": [1.0, 5.27]}) == [
        "wm:{s}:series:PUMP-7.vibration",
        "5.27",
    ]
    assert fragment_cites("NS", "NS:ns:{fleet}:kv:baseline:PUMP", {"rms_p95": 3.4}) == [
        "ns:{fleet}:kv:baseline:PUMP",
        "3.4",
    ]
    l3 = {"text": "Alarm above 4.5 mm/s RMS.", "title": "Pump vibration limits", "page": "7200011"}
    assert fragment_cites("L3", "L3:knowledge_main:0f1e-uuid", l3) == [
        "0f1e-uuid",
        "7200011",
        "Pump vibration limits",
        "4.5",
    ]
    # L1: a field name is not evidence, only what the value holds
    assert fragment_cites("L1", "L1:session.last_device_id", "PUMP-0042") == ["PUMP-0042"]
    assert fragment_cites("L1", "L1:session.current_step", 2) == []


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, gateway=Gateway())

    def work(n: int) -> None:
        for i in range(50):
            writer.write_route(route_record(session_id=f"s-{n}", step=i))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = list(read_traces(tmp_path))
    assert len(records) == 300
    for rec in records:
        validate_record(rec)
    assert {(r["session_id"], r["step"]) for r in records} == {
        (f"s-{n}", i) for n in range(6) for i in range(50)
    }


def test_read_traces_filters_by_day_and_time(tmp_path: Path) -> None:
    days = [dt.date(2026, 3, d) for d in (1, 2, 3)]
    for d in days:
        ts = dt.datetime.combine(d, dt.time(12, 0), tzinfo=dt.UTC).isoformat()
        rec = {**route_record(), "schema": 3, "kind": "route", "ts": ts}
        validate_record(rec)
        trace_file(tmp_path, d).write_text(json.dumps(rec) + "\n\n", encoding="utf-8")
    (tmp_path / "notes.jsonl").write_text("ignored\n", encoding="utf-8")

    assert len(list(read_traces(tmp_path))) == 3
    assert [r["ts"][:10] for r in read_traces(tmp_path, since=days[1])] == [
        "2026-03-02",
        "2026-03-03",
    ]
    assert [r["ts"][:10] for r in read_traces(tmp_path, until=days[0])] == ["2026-03-01"]
    noon = dt.datetime(2026, 3, 2, 12, 0, 1)  # naive = UTC; one second after the record
    assert [r["ts"][:10] for r in read_traces(tmp_path, since=noon)] == ["2026-03-03"]


def test_corrupt_line_names_file_and_line(tmp_path: Path) -> None:
    path = trace_file(tmp_path, dt.date(2026, 3, 1))
    path.write_text('{"kind": "route"}\n{oops\n', encoding="utf-8")
    with pytest.raises(DataValidationError, match="traces-2026-03-01") as exc:
        list(read_traces(tmp_path))
    assert exc.value.failures[0].startswith("line 2")


def test_writer_reopens_a_removed_file(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, gateway=Gateway())
    writer.write_route(route_record())
    (path,) = tmp_path.glob("*.jsonl")
    path.unlink()  # e.g. a cleanup job removed today's file
    writer.write_route(route_record(step=7))
    writer.close()
    writer.write_route(route_record(step=8))
    assert [r["step"] for r in read_traces(tmp_path)] == [7, 8]


def test_writer_follows_a_rotated_file(tmp_path: Path) -> None:
    """Rotation (the day's file renamed away, a new one created under the name) sends the
    next record to the new file, not to the renamed one still open."""
    writer = TraceWriter(tmp_path, gateway=Gateway())
    writer.write_route(route_record(step=1))
    (path,) = tmp_path.glob("*.jsonl")
    rotated = path.with_name(path.name + ".1")
    path.rename(rotated)
    path.write_text("", encoding="utf-8")  # e.g. logrotate's create
    writer.write_route(route_record(step=2))
    assert [json.loads(x)["step"] for x in rotated.read_text().splitlines()] == [1]
    assert [r["step"] for r in read_traces(tmp_path)] == [2]


def test_hashed_key_names_cover_references_and_preference_keys(tmp_path: Path) -> None:
    """With hash_keys, a by-reference source and a preference key's user id are hashed the
    same way as everywhere else in the record; the fallback text passes the gateway."""
    writer = TraceWriter(tmp_path, gateway=Gateway(), hash_keys=True, hash_key=b"k" * 32)
    pref = "pref:{alice.smith}:units"
    series = "wm:{s-1}:series:PUMP-0042.vibration"
    rec = route_record(
        by_reference=[
            {"layer": "L2", "source": f"L2:{series}", "relevance": 1.0, "label": "exact"},
            {"layer": "L2", "source": f"L2:{pref}", "relevance": 0.8, "label": "preference"},
        ],
        fallback={
            "triggered": True,
            "reason": "as I told you, mail me at someone@example.com",
            "confirm_at": "/v1/sessions/s-1/confirmations",
        },
    )
    rec["l2"] = {**rec["l2"], "requested": [*rec["l2"]["requested"], pref]}
    written = writer.write_route(rec)
    hashed_pref = writer.key_name(pref)
    assert hashed_pref.startswith("pref:{#") and hashed_pref.endswith("}:units")
    assert "alice" not in hashed_pref
    assert written["l2"]["requested"][-1] == hashed_pref
    assert [r["source"] for r in written["by_reference"]] == [
        f"L2:{writer.key_name(series)}",
        f"L2:{hashed_pref}",
    ]
    assert "PUMP-0042" not in written["by_reference"][0]["source"]
    assert "someone@example.com" not in written["fallback"]["reason"]
    assert written["fallback"]["confirm_at"] == "/v1/sessions/s-1/confirmations"
    text = next(tmp_path.glob("*.jsonl")).read_text(encoding="utf-8")
    assert "alice.smith" not in text and "someone@example.com" not in text


def test_l3_cites_are_remembered_by_everything_they_depend_on() -> None:
    from context_core.traces import fragment_cites

    page = {"page": "10816-3", "title": "Vibration limits", "text": "Zone B up to 7.1 mm/s"}
    first = fragment_cites("L3", "L3:knowledge_main:p-1", dict(page))
    assert first == ["p-1", "10816-3", "Vibration limits", "7.1"]
    again = fragment_cites("L3", "L3:knowledge_main:p-1", dict(page))
    assert again == first and again is not first  # a copy: the caller may change its list
    again.append("x")
    assert fragment_cites("L3", "L3:knowledge_main:p-1", dict(page)) == first
    changed = {**page, "text": "Zone C up to 11.2 mm/s"}
    assert fragment_cites("L3", "L3:knowledge_main:p-1", changed)[-1] == "11.2"
    assert fragment_cites("L3", "L3:knowledge_main:p-2", dict(page))[0] == "p-2"
    assert fragment_cites("L3", "L3:knowledge_main:p-1", {**page, "page": "4"})[1] == "4"
    assert len(fragment_cites("L3", "L3:knowledge_main:p-1", dict(page), limit=2)) == 2
