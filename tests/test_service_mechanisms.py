"""The design's mechanisms reached over HTTP, against a running service on real Redis:
plan-derived TTLs, the task contract's lifetime and history, the platform's own lifecycle
triggers (correction detection, L1 overflow, idle timeout), unlock after recovery,
confirmations into hot knowledge, preferences, the bundle budget, and thresholds that a
running service picks up from thresholds.json (bound to their model)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from conftest import cleanup_keys
from sealed_state import opened
from test_service import cleanup_service_keys, running_service, service_settings


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("mechanisms")
    # sweeps are run by the idle test's own service
    settings, raw = service_settings(tmp, redis_url, idle_sweep_interval_s=0)
    with running_service(settings) as url:
        yield {"url": url, "keys": raw, "settings": settings, "redis_url": redis_url}
    cleanup_service_keys(redis_url)
    cleanup_keys(redis_url, "pref:{*:u-mech-*")


def _client(svc: dict[str, Any], agent: str = "agent-a") -> httpx.Client:
    return httpx.Client(base_url=svc["url"], headers={"X-API-Key": svc["keys"][agent]}, timeout=30)


@pytest.fixture
def client(svc: dict[str, Any]) -> Iterator[httpx.Client]:
    with _client(svc) as c:
        yield c


@pytest.fixture
def r(svc: dict[str, Any]) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(svc["redis_url"], decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def sid() -> str:
    return f"t-mech-{uuid.uuid4().hex[:12]}"


def _start(c: httpx.Client, sid: str, **extra: Any) -> str:
    body = {
        "session_id": sid,
        "user_id": f"u-mech-{sid[-6:]}",
        "user_query": "check pump vibration",
    }
    r = c.post("/v1/sessions", json={**body, **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["state"])


def _event(c: httpx.Client, sid: str, state: Any, **event: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _tool(c: httpx.Client, sid: str, state: Any, **result: Any) -> dict[str, Any]:
    return _event(
        c, sid, state, type="tool_call", name="read_sensor", args={}, result=result or {"ok": 1}
    )


def _route(c: httpx.Client, sid: str, state: Any, intent: str, **params: Any) -> httpx.Response:
    return c.post(
        "/v1/context",
        json={"session_id": sid, "step_intent": intent, "state": state, "params": params},
    )


# --- plan-derived TTLs ------------------------------------------------------------------


def test_a_plan_sent_over_http_changes_the_ttls_redis_reports(
    client: httpx.Client, sid: str, r: redis.Redis
) -> None:
    state = _start(client, sid)
    state = _tool(client, sid, state, rms=4.1)["state"]  # writes step:0 with the default TTL
    step0 = f"wm:{{{sid}}}:step:0"
    assert 850 < r.ttl(step0) <= 900

    plan = {
        "steps": [
            {"step_id": "0"},
            {"step_id": "1", "depends_on": ["0"], "est_start_s": 100},
            {"step_id": "2", "depends_on": ["1"], "est_start_s": 400},
        ],
        "factor": 2.0,
    }
    resp = client.put(f"/v1/sessions/{sid}/plan", json=plan)
    assert resp.status_code == 200, resp.text
    assert resp.json()["ttls"] == {"0": 200}  # step 1 starts in 100 s, x2
    assert 190 < r.ttl(step0) <= 200  # what Redis reports changed with the plan

    # step 1, written later through the service, gets its TTL from the stored plan (400 x 2)
    state = _tool(client, sid, state, rms=4.2)["state"]
    assert 780 < r.ttl(f"wm:{{{sid}}}:step:1") <= 800
    got = client.get(f"/v1/sessions/{sid}/plan").json()
    assert got["plan"]["steps"]["2"]["depends_on"] == ["1"]
    assert set(got["ttls"]) == {"0", "1"}


def test_a_bad_plan_is_a_422_naming_the_step(
    client: httpx.Client, sid: str, svc: dict[str, Any]
) -> None:
    _start(client, sid)
    bad = {"steps": [{"step_id": "a", "depends_on": ["nope"]}]}
    resp = client.put(f"/v1/sessions/{sid}/plan", json=bad)
    assert resp.status_code == 422
    assert "depends_on" in resp.text and "nope" in resp.text
    resp = client.put(f"/v1/sessions/{sid}/plan", json={"steps": [{"step_id": "a:b"}]})
    assert resp.status_code == 422 and "step_id" in resp.text
    with _client(svc, "agent-b") as other:
        resp = other.put(f"/v1/sessions/{sid}/plan", json={"steps": [{"step_id": "a"}]})
    assert resp.status_code == 404  # another agent's session answers like a missing one


# --- the task contract ------------------------------------------------------------------


def test_contract_lives_for_the_task_with_its_history(
    client: httpx.Client, sid: str, svc: dict[str, Any]
) -> None:
    state = _start(client, sid, contract={"unit": "celsius"})
    c = client.get(f"/v1/sessions/{sid}/contract").json()
    assert c["status"] == "active" and c["version"] == 1
    assert 7100 < c["ttl_s"] <= 7200  # the task's lifetime, not the 900 s L2 default
    _event(client, sid, state, type="user_correction", fields={"unit": "kelvin"})
    hist = client.get(f"/v1/sessions/{sid}/contract/history").json()["versions"]
    assert [v["version"] for v in hist] == [1, 2]
    assert hist[1]["fields"]["unit"] == "kelvin" and hist[1]["corrected"] is True


def test_a_user_message_that_contradicts_the_contract_is_applied_as_a_correction(
    client: httpx.Client, sid: str
) -> None:
    state = _start(client, sid, contract={"unit": "celsius"})
    out = _event(client, sid, state, type="user_message", text="thanks, that looks right")
    assert out["info"]["correction"]["detected"] is False
    assert client.get(f"/v1/sessions/{sid}/contract").json()["version"] == 1

    out = _event(
        client,
        sid,
        out["state"],
        type="user_message",
        text="No, not celsius - the unit should be fahrenheit.",
    )
    det = out["info"]["correction"]
    assert det["detected"] is True and det["confidence"] > 0.6
    c = client.get(f"/v1/sessions/{sid}/contract").json()
    assert c["version"] == 2 and c["corrected"] is True
    assert c["fields"]["unit"] == "fahrenheit"


def test_error_recovery_locks_the_contract_until_recovery_complete(
    client: httpx.Client, sid: str
) -> None:
    state = _start(client, sid)
    state = _event(client, sid, state, type="error_recovery")["state"]
    resp = client.post(
        f"/v1/sessions/{sid}/events",
        json={"state": state, "event": {"type": "user_correction", "fields": {"x": 1}}},
    )
    assert resp.status_code == 423 and resp.json()["error"] == "contract_locked"
    state = _event(client, sid, state, type="recovery_complete")["state"]
    assert client.get(f"/v1/sessions/{sid}/contract").json()["locked"] is False
    _event(client, sid, state, type="user_correction", fields={"x": 1})
    assert client.get(f"/v1/sessions/{sid}/contract").json()["fields"]["x"] == 1


def test_session_timeout_clears_l1_and_keeps_the_contract_marked_expired(
    client: httpx.Client, sid: str, r: redis.Redis, svc: dict[str, Any]
) -> None:
    state = _start(client, sid)
    state = _tool(client, sid, state, rms=1.0)["state"]
    assert opened(svc["settings"], state, sid)["trace"]
    out = _event(client, sid, state, type="session_timeout")
    assert opened(svc["settings"], out["state"], sid)["trace"] == []
    assert not r.exists(f"wm:{{{sid}}}:step:0")
    c = client.get(f"/v1/sessions/{sid}/contract").json()
    assert c["status"] == "expired" and c["version"] == 1
    assert c["fields"]["goal"] == "check pump vibration"


def test_goal_achieved_archives_the_contract_and_records_the_last_completed_task(
    client: httpx.Client, sid: str, svc: dict[str, Any]
) -> None:
    state = _start(client, sid, contract={"unit": "celsius"})
    state = _tool(client, sid, state, rms=2.0)["state"]
    out = _event(client, sid, state, type="goal_achieved")
    assert opened(svc["settings"], out["state"], sid)["trace"] == []
    hist = client.get(f"/v1/sessions/{sid}/contract/history").json()["versions"]
    assert hist[-1]["status"] == "completed"
    prefs = client.get(f"/v1/sessions/{sid}/preferences").json()["preferences"]
    last = prefs["last_completed_task"]["value"]
    assert "check pump vibration" in json.dumps(last)


# --- platform triggers ---------------------------------------------------------------------


def test_a_trace_over_the_token_budget_evicts_its_oldest_pairs(
    client: httpx.Client, sid: str, svc: dict[str, Any]
) -> None:
    state = _start(client, sid)
    # ~800 tokens in 1.6 KB: under CTX_L1_MAX_RESULT_BYTES (2 KB), so each result stays in
    # L1 rather than going to L2, and three of them are over the 2,000-token budget
    words = " ".join(str(i % 10) for i in range(800))
    overflow = None
    for _ in range(4):
        out = _tool(client, sid, state, note=words)
        state = out["state"]
        overflow = out["info"].get("overflow") or overflow
    assert overflow is not None and overflow["triggered"] is True
    assert overflow["tokens_after"] <= 2000 < overflow["tokens_before"]
    assert len(opened(svc["settings"], state, sid)["trace"]) < 16


# --- confirmations, preferences, budget --------------------------------------------------


def test_confirmations_go_to_hot_knowledge_as_the_calling_agent(
    client: httpx.Client, sid: str
) -> None:
    state = _start(client, sid, device_id="PUMP-0042")
    answer = f"Seal flush plan {uuid.uuid4().hex[:6]} for PUMP units uses API plan 53B."
    resp = client.post(
        f"/v1/sessions/{sid}/confirmations",
        json={"state": state, "answers": [{"text": answer, "section": "PUMP"}]},
    )
    assert resp.status_code == 201, resp.text
    confirmed = resp.json()["confirmed"]
    assert len(confirmed) == 1 and confirmed[0]["id"]
    got = _route(client, sid, state, "default", query=answer)
    assert got.status_code == 200, got.text
    l3 = [f for f in got.json()["fragments"] if f["layer"] == "L3"]
    assert l3 and l3[0]["content"]["text"] == answer
    assert l3[0]["label"] == "low_confidence" and l3[0]["content"]["written_by"] == "agent-a"
    bad = client.post(f"/v1/sessions/{sid}/confirmations", json={"state": state, "answers": []})
    assert bad.status_code == 422 and "answers" in bad.text


def test_preferences_over_http_for_the_sessions_user_only(
    client: httpx.Client, sid: str, svc: dict[str, Any]
) -> None:
    _start(client, sid)
    resp = client.put(
        f"/v1/sessions/{sid}/preferences/report_language", json={"value": "de", "confidence": 0.8}
    )
    assert resp.status_code == 200, resp.text
    prefs = client.get(f"/v1/sessions/{sid}/preferences").json()["preferences"]
    assert prefs["report_language"]["value"] == "de"
    assert prefs["report_language"]["confidence"] == 0.8
    bad = client.put(f"/v1/sessions/{sid}/preferences/Bad-Type", json={"value": 1})
    assert bad.status_code == 422 and "pref_type" in bad.text
    with _client(svc, "agent-b") as other:
        assert other.get(f"/v1/sessions/{sid}/preferences").status_code == 404
    gone = client.delete(f"/v1/sessions/{sid}/preferences/report_language")
    assert gone.json() == {"type": "report_language", "deleted": True}


def test_a_bundle_holds_at_most_three_fragments_and_lists_the_rest(
    client: httpx.Client, sid: str
) -> None:
    state = _start(client, sid, device_id="PUMP-0042")
    state = _tool(client, sid, state, rms=4.0)["state"]
    resp = _route(client, sid, state, "generate_report")
    assert resp.status_code == 200, resp.text
    bundle = resp.json()
    assert 1 <= len(bundle["fragments"]) <= 3
    refs = bundle["context_used"]["by_reference"]
    assert refs, "the fragments over the budget are listed by reference"
    assert all("content" not in ref for ref in refs)
    delivered = {f["source"] for f in bundle["fragments"]}
    assert delivered.isdisjoint(ref["source"] for ref in refs)


# --- thresholds in force -------------------------------------------------------------------


def _metric(c: httpx.Client, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _write_thresholds(path: Path, accept: float, skip: float, model: str) -> None:
    doc = {"accept": accept, "skip": skip, "provenance": {"model": model}}
    tmp = path.with_name(".t.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _last_route_trace(svc: dict[str, Any], trace_id: str) -> dict[str, Any]:
    for f in sorted(svc["settings"].traces_dir.glob("traces-*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("trace_id") == trace_id and rec.get("kind", "route") == "route":
                return dict(rec)
    raise AssertionError(f"no route trace {trace_id}")


def test_a_calibration_written_while_the_service_runs_is_in_force_on_the_next_route(
    client: httpx.Client, sid: str, svc: dict[str, Any]
) -> None:
    path = svc["settings"].resolved_thresholds_path
    state = _start(client, sid)
    try:
        _write_thresholds(path, 0.41, 0.23, "minilm")
        resp = _route(client, sid, state, "default", query="pump seal leak")
        assert resp.status_code == 200, resp.text
        rec = _last_route_trace(svc, resp.json()["trace_id"])
        assert (rec["confidence"]["accept"], rec["confidence"]["skip"]) == (0.41, 0.23)
        assert rec["confidence"]["model"] == "minilm"
        m = _metric(client, "ctx_confidence_threshold")
        assert m['ctx_confidence_threshold{bound="accept"}'] == 0.41

        # calibrated for another model: refused, the defaults are in force and it shows
        _write_thresholds(path, 0.30, 0.10, "bge-m3")
        resp = _route(client, sid, state, "default", query="pump seal leak")
        rec = _last_route_trace(svc, resp.json()["trace_id"])
        assert (rec["confidence"]["accept"], rec["confidence"]["skip"]) == (0.72, 0.65)
        assert _metric(client, "ctx_thresholds_model_mismatch")[
            "ctx_thresholds_model_mismatch"
        ] == (1.0)
    finally:
        path.unlink(missing_ok=True)


# --- the idle sweep ------------------------------------------------------------------------


def test_an_idle_session_is_timed_out_by_the_services_own_sweep(
    tmp_path: Path, redis_url: str
) -> None:
    settings, raw = service_settings(
        tmp_path, redis_url, session_idle_s=1, idle_sweep_interval_s=0.3
    )
    sid = f"t-idle-{uuid.uuid4().hex[:10]}"
    busy = f"t-busy-{uuid.uuid4().hex[:10]}"
    with (
        running_service(settings) as url,
        httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=30) as c,
    ):
        state = _start(c, sid)
        state = _tool(c, sid, state, rms=3.0)["state"]
        other = _start(c, busy)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:  # `busy` stays active, `sid` goes idle
            other = _tool(c, busy, other, rms=1.0)["state"]
            time.sleep(0.2)
        contract = c.get(f"/v1/sessions/{sid}/contract").json()
        assert contract["status"] == "expired" and contract["version"] == 1
        assert c.get(f"/v1/sessions/{busy}/contract").json()["status"] == "active"
        # the L1 state the client holds is superseded by the cleared one
        resp = c.post(
            f"/v1/sessions/{sid}/events",
            json={"state": state, "event": {"type": "tool_call", "name": "x", "result": 1}},
        )
        assert resp.status_code == 409 and resp.json()["error"] == "stale_state"
        latest = c.get(f"/v1/sessions/{sid}/state").json()["state"]
        now, before = (opened(settings, s, sid) for s in (latest, state))
        assert now["trace"] == [] and now["version"] == before["version"] + 1
        # and the session resumes from it: the contract is active again
        _tool(c, sid, latest, rms=3.1)
        assert c.get(f"/v1/sessions/{sid}/contract").json()["status"] == "active"
    cleanup_keys(redis_url, f"svc:{{{sid}}}*")
    cleanup_keys(redis_url, f"wm:{{{sid}}}*")
    cleanup_keys(redis_url, f"svc:{{{busy}}}*")
    cleanup_keys(redis_url, f"wm:{{{busy}}}*")
