"""Trace writer: schema validation on write, daily files, thread safety, reading back."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from context_core.errors import DataValidationError
from context_core.gateway import Gateway
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
    "degraded",
    "timings_ms",
}


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
        "degraded": False,
        "timings_ms": {"l1": 0.01, "l2": 0.3, "l3": 4.2, "total": 4.6},
    }
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
    assert rec["schema"] == 2 and rec["kind"] == "route"
    assert set(rec["l2"]) == {"requested", "required", "found", "missing", "expired"}
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
        ({"schema": 3}, "schema"),
        ({"schema": 1}, "cites"),  # a schema-1 record may not carry schema-2 fields
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
    assert out[0]["schema"] == 2
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


def test_schema_1_records_stay_valid_and_are_stamped_as_such(tmp_path: Path) -> None:
    """Old files keep validating; a caller writing the old l2 shape gets schema 1, not 2."""
    rec = route_record()
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
        rec = {**route_record(), "schema": 2, "kind": "route", "ts": ts}
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
