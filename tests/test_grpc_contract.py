"""The gRPC service against the HTTP service: the README's scripted session and the error
cases run over both, step by step, on one real service (uvicorn on a loopback port with the
gRPC server on another, real Redis or embedded Valkey, Qdrant Edge on a temp dir), and the
answers must match. The gRPC client here uses only the generated stubs (plus grpcio, the
protobuf runtime and grpcio-status to read the error details)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from sealed_state import opened
from test_service import cleanup_service_keys, free_port, running_service, service_settings

from context_app.rpc.v1 import context_pb2 as pb
from context_app.rpc.v1 import context_pb2_grpc as pb_grpc

DEVICE = "PUMP-0042"
VOLATILE = {
    "timings_ms",
    "trace_id",
    "freshness_hours",
    "bundle_id",
    "base_bundle_id",
    "call_id",
    "hash",
}


@pytest.fixture(scope="module")
def redis_url(default_redis_url: str) -> str:
    return default_redis_url


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("grpc")
    port = free_port()
    settings, raw = service_settings(tmp, redis_url, max_body_bytes=64 * 1024, grpc_port=port)
    with running_service(settings) as url:
        _seed_knowledge(url, raw["agent-a"])
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield {
            "url": url,
            "keys": raw,
            "channel": channel,
            "settings": settings,
            "target": f"127.0.0.1:{port}",
        }
        channel.close()
    cleanup_service_keys(redis_url)


SEEDED = "PUMP-0042 vibration above the 4.5 mm/s alarm: replace the drive-end bearing."


def _seed_knowledge(url: str, key: str) -> None:
    """A confirmed answer in L3 (hot knowledge of agent-a), so bundles hold L3 fragments."""
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=60) as c:
        sid = f"t-seed-{uuid.uuid4().hex[:8]}"
        body = {"session_id": sid, "user_id": "u-0", "user_query": "pump vibration"}
        state = c.post("/v1/sessions", json=body).json()["state"]
        answer = {"text": SEEDED, "source": "seed", "section": "PUMP"}  # PUMP-0042's section
        event = {"type": "goal_achieved", "answers": [answer]}
        r = c.post(f"/v1/sessions/{sid}/events", json={"state": state, "event": event})
        assert r.status_code == 200, r.text


class Pair:
    """One agent, over HTTP and over gRPC, running the same session under two ids."""

    def __init__(self, both: dict[str, Any], agent: str, sid: str) -> None:
        key = both["keys"][agent]
        self.http = httpx.Client(base_url=both["url"], headers={"X-API-Key": key}, timeout=60)
        self.stub = pb_grpc.ContextServiceStub(both["channel"])
        self.md = (("authorization", f"Bearer {key}"),)
        self.sid = {"http": f"t-h-{sid}", "grpc": f"t-g-{sid}"}
        self.state: dict[str, str] = {}  # sealed, per transport
        self.settings = both["settings"]

    def opened(self, state: str, via: str) -> dict[str, Any]:
        """What the service sealed in ``state`` (a client cannot: tests/sealed_state.py)."""
        return opened(self.settings, state, self.sid[via])

    def call(self, method: str, request: Any) -> Any:
        return getattr(self.stub, method)(request, metadata=self.md, timeout=60)


def _d(msg: Any) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _norm(value: Any, sids: tuple[str, ...]) -> Any:
    """Without what differs run to run (ids, ages, timings) and without nulls (proto3 leaves
    an unset optional field out); the two session ids as one."""
    if isinstance(value, dict):
        return {k: _norm(v, sids) for k, v in value.items() if k not in VOLATILE and v is not None}
    if isinstance(value, list):
        return [_norm(v, sids) for v in value]
    if isinstance(value, str):
        for s in sids:
            value = value.replace(s, "<sid>")
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return round(float(value), 6)
    return value


def _same(p: Pair, http_answer: Any, grpc_answer: Any) -> Any:
    sids = (p.sid["http"], p.sid["grpc"])
    a, b = _norm(http_answer, sids), _norm(grpc_answer, sids)
    assert a == b, _diff(a, b)
    return a


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where HTTP's answer (a) and gRPC's (b) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'http' if k in a else 'grpc'}")
            else:
                out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            x
            for i, (u, v) in enumerate(zip(a, b, strict=True))
            for x in _diff(u, v, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _state_view(state: dict[str, Any]) -> dict[str, Any]:
    """What the client may compare of two states of two sessions: all but ids, nonces,
    signatures and clocks."""
    skip = {"session_id", "nonce", "sig", "signature", "version", "started_at", "updated_at"}
    return _timeless({k: v for k, v in state.items() if k not in skip})


def _timeless(value: Any) -> Any:
    """Without clock readings (``*_at``, ``*_time``, ``ts``, ``timestamp``)."""
    if isinstance(value, dict):
        return {
            k: _timeless(v)
            for k, v in value.items()
            if not (k.endswith(("_at", "_time")) or k in ("ts", "timestamp"))
        }
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _same_state(p: Pair, h: dict[str, Any], g: Any) -> None:
    """HTTP's and gRPC's answers carry the same state (sealed, so opened to compare) and the
    same clear session info."""
    assert h["state"].startswith("ctx1.") and g.state.startswith("ctx1.")
    _same(p, _state_view(p.opened(h["state"], "http")), _state_view(p.opened(g.state, "grpc")))
    _same(p, h["session"], _d(g.session))


def _start(p: Pair, **extra: Any) -> dict[str, Any]:
    body = {"user_id": "u-1", "user_query": "Why does PUMP-0042 vibrate?", **extra}
    r = p.http.post("/v1/sessions", json={**body, "session_id": p.sid["http"]})
    assert r.status_code == 201, r.text
    contract = struct_pb2.Struct()
    contract.update(body.pop("contract", {}))
    g = p.call(
        "CreateSession",
        pb.CreateSessionRequest(session_id=p.sid["grpc"], contract=contract, **body),
    )
    h = r.json()
    p.state = {"http": h["state"], "grpc": g.state}
    _same(p, h["info"], _d(g.info))
    _same_state(p, h, g)
    return h


def _event(p: Pair, http_event: dict[str, Any], grpc_event: pb.Event) -> dict[str, Any]:
    r = p.http.post(
        f"/v1/sessions/{p.sid['http']}/events",
        json={"state": p.state["http"], "event": http_event},
    )
    assert r.status_code == 200, r.text
    g = p.call(
        "PostEvent",
        pb.EventRequest(session_id=p.sid["grpc"], state=p.state["grpc"], event=grpc_event),
    )
    h = r.json()
    p.state = {"http": h["state"], "grpc": g.state}
    _same(p, h["info"], _d(g.info))
    _same_state(p, h, g)
    return h


def _context(p: Pair, intent: str, **params: Any) -> dict[str, Any]:
    r = p.http.post(
        "/v1/context",
        json={
            "session_id": p.sid["http"],
            "step_intent": intent,
            "state": p.state["http"],
            "params": params,
        },
    )
    assert r.status_code == 200, r.text
    gp = pb.ContextParams()
    for k, v in params.items():
        if k == "api_params":
            gp.api_params.update(v)
        else:
            setattr(gp, k, v)
    g = p.call(
        "GetContext",
        pb.ContextRequest(
            session_id=p.sid["grpc"], step_intent=intent, state=p.state["grpc"], params=gp
        ),
    )
    return _same(p, r.json(), _d(g))


def _tool(name: str, args: dict[str, Any], result: dict[str, Any], **extra: Any) -> Any:
    a, res = struct_pb2.Struct(), struct_pb2.Value()
    a.update(args)
    res.struct_value.update(result)
    call = pb.ToolCall(name=name, args=a, result=res)
    for series, points in extra.get("series", {}).items():
        call.series[series].points.extend(pb.Point(ts=t, value=v) for t, v in points)
    http = {"type": "tool_call", "name": name, "args": args, "result": result, **extra}
    return http, pb.Event(tool_call=call)


def test_readme_session_gives_the_same_answers_over_http_and_grpc(
    both: dict[str, Any], session_id: str
) -> None:
    p = Pair(both, "agent-a", session_id)
    _start(p, device_id=DEVICE, contract={"device": DEVICE, "report_length": "short"})
    first = _context(p, "fetch_sensor_data")
    assert first["intent"] == "fetch_sensor_data" and first["fragments"]

    now = time.time()
    series = [[now - 60 * (11 - i), round(2.3 + 0.27 * i, 2)] for i in range(12)]
    _event(
        p,
        *_tool(
            "sensors/vibration",
            {"device": DEVICE, "window": "last 1h"},
            {"rms_mm_s": 5.27, "peak_hz": 49.6, "points": 12},
            series={f"{DEVICE}.vibration": series},
        ),
    )
    compare = _context(p, "compare_vibration")
    sources = {f["source"] for f in compare["fragments"]}
    assert f"L2:wm:{{<sid>}}:series:{DEVICE}.vibration" in sources
    _event(p, *_tool("analysis/compare", {"device": DEVICE}, {"verdict": "above alarm"}))
    _context(p, "call_api", endpoint="maintenance/history", api_params={"device": DEVICE})
    _event(
        p,
        *_tool("maintenance/history", {"device": DEVICE}, {"last_service": "2026-08-14"}),
    )
    fields = {"report_length": "one page", "include_bearing_history": True}
    corr = struct_pb2.Struct()
    corr.update(fields)
    info = _event(
        p,
        {"type": "user_correction", "fields": fields},
        pb.Event(user_correction=pb.UserCorrection(fields=corr)),
    )["info"]
    assert info["event"] == "user_correction"
    report = _context(p, "generate_report")
    assert report["step"] == 3
    # beyond the README: a step whose bundle holds L3 knowledge (the seeded answer)
    lookup = _context(p, "default", query=SEEDED)
    l3 = [f for f in lookup["fragments"] if f["layer"] == "L3"]
    assert l3 and l3[0]["content"]["text"] == SEEDED

    # the step's output, sanitized the same way (a fake secret removed from both)
    text = "Replace the bearing. token sk_live_" + "b" * 24
    r = p.http.post(
        f"/v1/sessions/{p.sid['http']}/outputs",
        json={"state": p.state["http"], "trace_id": "tr-1", "output": text},
    )
    assert r.status_code == 200, r.text
    g = p.call(
        "PostOutput",
        pb.OutputRequest(
            session_id=p.sid["grpc"], state=p.state["grpc"], trace_id="tr-1", output=text
        ),
    )
    h = r.json()
    assert "sk_live_" not in g.output
    _same(
        p,
        {k: h[k] for k in ("info", "output", "removed")},
        {"info": _d(g.info), "output": g.output, "removed": [_d(x) for x in g.removed]},
    )
    _same_state(p, h, g)

    # delta recall: the stream's deltas are HTTP's deltas, chained
    steps = ["compare_vibration", "generate_report"]
    http_deltas, since = [], None
    for intent in steps:
        body: dict[str, Any] = {
            "session_id": p.sid["http"],
            "step_intent": intent,
            "state": p.state["http"],
            "delta": True,
        }
        if since:
            body["since_bundle"] = since
        d = p.http.post("/v1/context", json=body).json()
        since = d["bundle_id"]
        http_deltas.append(d)
    grpc_deltas = list(
        p.call(
            "StreamContext",
            pb.ContextStreamRequest(
                session_id=p.sid["grpc"],
                state=p.state["grpc"],
                steps=[pb.ContextStep(step_intent=i) for i in steps],
            ),
        )
    )
    assert len(grpc_deltas) == 2
    assert grpc_deltas[0].full and not grpc_deltas[1].full
    assert grpc_deltas[1].base_bundle_id == grpc_deltas[0].bundle_id
    assert len(grpc_deltas[1].unchanged) > 0  # the second step reuses fragments by reference
    for h_d, g_d in zip(http_deltas, grpc_deltas, strict=True):
        _same(p, h_d, _d(g_d))

    r = p.http.get(f"/v1/sessions/{p.sid['http']}/state")
    g = p.call("GetState", pb.SessionRef(session_id=p.sid["grpc"]))
    _same_state(p, r.json(), g)

    r = p.http.delete(f"/v1/sessions/{p.sid['http']}")
    g = p.call("CloseSession", pb.SessionRef(session_id=p.sid["grpc"]))
    assert r.json()["deleted_keys"] == g.deleted_keys > 0


def _grpc_error(fn: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, dict[str, Any]]:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)
    err = info.value
    status = rpc_status.from_call(err)
    assert status is not None, "no google.rpc.Status in the trailers"
    out: dict[str, Any] = {"message": status.message, "violations": []}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            ei = error_details_pb2.ErrorInfo()
            detail.Unpack(ei)
            out["reason"], out["metadata"] = ei.reason, dict(ei.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            out["violations"] = [v.field for v in br.field_violations]
    return err.code(), out


def test_errors_map_to_status_codes_naming_the_field(both: dict[str, Any], session_id: str) -> None:
    a = Pair(both, "agent-a", session_id)
    _start(a)

    # a bad key
    r = httpx.post(both["url"] + "/v1/sessions", headers={"X-API-Key": "nope"}, json={})
    assert r.status_code == 401
    code, err = _grpc_error(
        a.stub.CreateSession,
        pb.CreateSessionRequest(user_id="u", user_query="q"),
        metadata=(("authorization", "Bearer nope"),),
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED and err["reason"] == "unauthenticated"
    assert "authorization: Bearer" in err["message"]

    # another agent's session: exactly like a missing one
    b = Pair(both, "agent-b", session_id)
    r = b.http.get(f"/v1/sessions/{a.sid['http']}/state")
    code, err = _grpc_error(b.call, "GetState", pb.SessionRef(session_id=a.sid["grpc"]))
    assert r.status_code == 404 and code == grpc.StatusCode.NOT_FOUND
    assert err["reason"] == r.json()["error"]
    assert err["metadata"]["http_status"] == "404"

    # an oversized message (the test service reads at most 64 KiB)
    big = "x" * (70 * 1024)
    r = a.http.post(
        f"/v1/sessions/{a.sid['http']}/outputs",
        json={"state": a.state["http"], "trace_id": "t", "output": big},
    )
    code, err = _grpc_error(
        a.call,
        "PostOutput",
        pb.OutputRequest(session_id=a.sid["grpc"], state=a.state["grpc"], trace_id="t", output=big),
    )
    assert r.status_code == 413 and code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err["reason"] == r.json()["error"] == "payload_too_large"
    assert "CTX_MAX_BODY_BYTES" in err["message"]

    # a bad field: an unknown intent, and a tool call without its name
    r = a.http.post(
        "/v1/context",
        json={"session_id": a.sid["http"], "step_intent": "nope", "state": a.state["http"]},
    )
    code, err = _grpc_error(
        a.call,
        "GetContext",
        pb.ContextRequest(session_id=a.sid["grpc"], step_intent="nope", state=a.state["grpc"]),
    )
    assert r.status_code == 422 and code == grpc.StatusCode.INVALID_ARGUMENT
    assert err["violations"] == [d["field"] for d in r.json()["detail"]] == ["step_intent"]
    assert "allowed" in err["message"]

    res = struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    code, err = _grpc_error(
        a.call,
        "PostEvent",
        pb.EventRequest(
            session_id=a.sid["grpc"],
            state=a.state["grpc"],
            event=pb.Event(tool_call=pb.ToolCall(name="", result=res)),
        ),
    )
    r = a.http.post(
        f"/v1/sessions/{a.sid['http']}/events",
        json={"state": a.state["http"], "event": {"type": "tool_call", "name": "", "result": None}},
    )
    assert r.status_code == 422 and code == grpc.StatusCode.INVALID_ARGUMENT
    assert err["violations"] == [d["field"] for d in r.json()["detail"]]
    assert err["violations"] == ["event.tool_call.name"]

    # a stream of no steps, and one whose second step names an unknown intent: the first
    # delta arrives, then the stream ends with the field's error
    code, err = _grpc_error(
        lambda: list(
            a.call(
                "StreamContext",
                pb.ContextStreamRequest(session_id=a.sid["grpc"], state=a.state["grpc"]),
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and err["violations"] == ["steps"]
    got: list[Any] = []
    steps = [pb.ContextStep(step_intent="call_api"), pb.ContextStep(step_intent="nope")]
    code, err = _grpc_error(
        lambda: got.extend(
            a.call(
                "StreamContext",
                pb.ContextStreamRequest(
                    session_id=a.sid["grpc"], state=a.state["grpc"], steps=steps
                ),
            )
        )
    )
    assert len(got) == 1 and got[0].full and got[0].intent == "call_api"
    assert code == grpc.StatusCode.INVALID_ARGUMENT and err["violations"] == ["step_intent"]

    # a state that is not the service's
    code, err = _grpc_error(
        a.call,
        "GetContext",
        pb.ContextRequest(session_id=a.sid["grpc"], step_intent="call_api", state="{"),
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and err["violations"] == ["state"]


def test_health_reflection_and_metrics(both: dict[str, Any]) -> None:
    health = health_pb2_grpc.HealthStub(both["channel"])
    for name in ("", "context.v1.ContextService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(both["channel"])
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    (answer,) = list(refl.ServerReflectionInfo(iter([req]), timeout=10))
    names = {s.name for s in answer.list_services_response.service}
    assert {"context.v1.ContextService", "grpc.health.v1.Health"} <= names
    text = httpx.get(both["url"] + "/metrics", timeout=10).text
    assert 'ctx_rpc_server_call_duration_seconds_count{rpc_grpc_status_code="OK"' in text
    assert "ctx_http_request_seconds" in text  # one registry, one scrape


@pytest.mark.slow
def test_ctx_serve_grpc_alone(tmp_path: Path) -> None:
    """`ctx serve --grpc-port N --no-http`: gRPC with the printed dev key, no HTTP port,
    health SERVING, a clean stop on SIGTERM."""
    port, http_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"CTX_REDIS_URL", "CTX_API_KEYS_FILE"}}
    env.update(CTX_DATA_DIR=str(tmp_path / "ctx"), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from context_app.cli import app; app()", "serve",
         "--port", str(http_port), "--grpc-port", str(port), "--no-http"],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        key = None
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            m = re.search(r"X-API-Key: (\S+)", line)
            if m:
                key = m.group(1)
                break
            assert time.monotonic() < deadline, "no dev key printed within 120 s"
        assert key is not None
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            health = health_pb2_grpc.HealthStub(channel)
            answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.ContextServiceStub(channel)
            reply = stub.CreateSession(
                pb.CreateSessionRequest(user_id="u", user_query="hello"),
                metadata=(("authorization", f"Bearer {key}"),),
                timeout=30,
            )
            assert reply.state.startswith("ctx1.") and "hello" not in reply.state
            assert reply.session.step == 0 and reply.session.session_id
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=2)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_the_docs_python_example_prints_what_the_page_shows(both: dict[str, Any]) -> None:
    """docs/grpc.md's example, run as it is against the test server."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "grpc.md").read_text()
    section = page.split("## From Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"```text\n(.*?)```", section, re.S)
    assert code and shown
    env = {**os.environ, "CTX_API_KEY": both["keys"]["agent-a"], "CTX_GRPC_TARGET": both["target"]}
    run = subprocess.run(
        [sys.executable, "-c", code.group(1)], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == shown.group(1)


def test_grpc_calls_count_for_degradation_like_http_requests(
    tmp_path: Path, redis_url: str, session_id: str
) -> None:
    """One load gauge for both protocols: with CTX_DEGRADE_INFLIGHT=1 a call counts itself,
    so over gRPC as over HTTP the bundle skips L3 and says degraded."""
    port = free_port()
    settings, raw = service_settings(tmp_path, redis_url, degrade_inflight=1, grpc_port=port)
    try:
        with running_service(settings) as url, grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            both = {"url": url, "keys": raw, "channel": ch, "settings": settings}
            p = Pair(both, "agent-a", session_id)
            _start(p, device_id=DEVICE)
            series = {f"{DEVICE}.vibration": [[time.time(), 4.1]]}
            _event(p, *_tool("sensors/vibration", {}, {"rms_mm_s": 4.1}, series=series))
            answer = _context(p, "compare_vibration")  # equal over both, checked inside
            assert answer["degraded"] is True
            assert not [f for f in answer["fragments"] if f["layer"] == "L3"]
    finally:
        cleanup_service_keys(redis_url)


def test_ctx_serve_refuses_grpc_with_workers_and_no_http_without_a_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from context_app.cli import app

    for name in ("CTX_GRPC_PORT", "CTX_SERVICE_HOST"):  # the command sets them: restored after
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    r = runner.invoke(app, ["serve", "--grpc-port", "50051", "--workers", "2"])
    assert r.exit_code == 2 and "--no-http" in r.output
    monkeypatch.delenv("CTX_GRPC_PORT", raising=False)
    r = runner.invoke(app, ["serve", "--no-http"])
    assert r.exit_code == 2 and "give --grpc-port" in r.output
